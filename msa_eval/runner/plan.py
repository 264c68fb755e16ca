"""Expand a suite into samples: every (task, length) is built ONCE with the reference
tokenizer, and the identical prompt text goes to every backend."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msa_eval.runner.config import ConfigError, SuiteConfig
from tasks.base import BuildSpec, Sample, Task, TaskError


@dataclass
class PlannedTask:
    task: Task
    length: int
    samples: list[Sample]


def make_task(name: str, options: dict[str, Any]) -> Task:
    from tasks.registry import all_tasks

    known = all_tasks()
    if name not in known:
        raise ConfigError(f"unknown task {name!r}: run `msa-eval tasks list` (known: {', '.join(known)})")
    try:
        return known[name](**options)
    except TypeError as e:
        raise ConfigError(f"task {name}: bad options {sorted(options)} ({e})") from None


def validate_tasks(suite: SuiteConfig) -> None:
    for t in suite.tasks:
        make_task(t.name, t.options)


def build_plan(
    suite: SuiteConfig, lengths: tuple[int, ...], tokenizer: Any, limit: int | None = None,
    only: tuple[str, ...] = (),
) -> list[PlannedTask]:
    """Samples per (task, length), in suite order; `limit` caps samples per (task, length).
    A task entry with its own `lengths` uses those instead of `lengths`."""
    plan: list[PlannedTask] = []
    entries = [t for t in suite.tasks if not only or t.name in only]
    if only:
        missing = set(only) - {t.name for t in suite.tasks}
        for name in sorted(missing):  # tasks outside the suite may be asked for by name
            make_task(name, {})
        from msa_eval.runner.config import TaskEntry

        entries += [TaskEntry(n) for n in only if n in missing]
    for entry in entries:
        task = make_task(entry.name, entry.options)
        n = entry.samples or suite.samples
        if limit is not None:
            n = min(n, limit)
        for length in entry.lengths or lengths:
            spec = BuildSpec(length, tokenizer, suite.mode, suite.seed, entry.max_tokens)
            try:
                samples = list(task.samples(spec, n))
            except TaskError as e:
                raise ConfigError(str(e)) from None
            plan.append(PlannedTask(task, length, samples))
    return plan
