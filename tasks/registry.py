"""Name -> Task registry. Task modules register their classes with `@register_task`;
suites are imported lazily on first lookup (one line per suite package in `SUITE_PACKAGES`)."""
from __future__ import annotations

import importlib

from tasks.base import Task, TaskError

# Packages whose import registers tasks. Missing packages are skipped (a suite still in work).
SUITE_PACKAGES = ["tasks.helmet", "tasks.loaders", "tasks.repo"]

_REGISTRY: dict[str, type[Task]] = {}
_loaded = False


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make `cls` available as `get_task(cls.name)`."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise TaskError(f"task name {cls.name!r} registered twice; rename one of them")
    _REGISTRY[cls.name] = cls
    return cls


def _load_suites() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for pkg in SUITE_PACKAGES:
        try:
            importlib.import_module(pkg)
        except ModuleNotFoundError as e:
            if e.name != pkg:  # a real import error inside the suite: surface it
                raise


def all_tasks() -> dict[str, type[Task]]:
    _load_suites()
    return dict(sorted(_REGISTRY.items()))


def get_task(name: str) -> Task:
    """An instance of the task called `name`; unknown names raise with the list of known ones."""
    tasks = all_tasks()
    if name not in tasks:
        known = ", ".join(tasks) or "(none)"
        raise TaskError(f"unknown task {name!r}; known tasks: {known}")
    return tasks[name]()
