"""Agent suites: YAML config (validated by pydantic, unknown keys are errors) -> generated,
validated tasks, cached as JSONL keyed by (config, family versions, source hashes).

`find_task(tasks, "A")` picks the first task of a family, `find_task(tasks, "A:<id>")` or
`find_task(tasks, "<id>")` a task by id; unknown ids raise naming the known ones.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from agents.errors import AgentHarnessError, UnknownTaskError
from agents.families import get_family
from agents.task import AgentTask

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "agents.yaml"


class _Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    families: dict[str, list[dict[str, Any]]]


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    suites: dict[str, _Suite]


def load_suite_config(name: str, path: Path | None = None) -> dict[str, Any]:
    path = Path(path or DEFAULT_CONFIG)
    if not path.is_file():
        raise AgentHarnessError(f"agent suite file {path} not found; pass --config PATH")
    try:
        cfg = _File.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as e:
        raise AgentHarnessError(f"{path}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    if name not in cfg.suites:
        raise AgentHarnessError(f"no agent suite {name!r} in {path}; suites: {', '.join(cfg.suites)}")
    return cfg.suites[name].model_dump()


def cache_dir() -> Path:
    from platformdirs import user_cache_dir

    return Path(os.environ.get("MSA_EVAL_CACHE") or user_cache_dir("msa-eval")) / "agent-suites"


def suite_key(name: str, suite: dict[str, Any]) -> str:
    versions = {c: get_family(c).version for c in suite["families"]}
    code = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.rglob("*.py")))).hexdigest()
    blob = json.dumps({"name": name, "suite": suite, "versions": versions, "code": code, "python": sys.version,
                       "prefix": sys.base_prefix}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def generate_suite(suite: dict[str, Any]) -> list[AgentTask]:
    """Generate every family entry of a suite config (deterministic under its seed)."""
    tasks: list[AgentTask] = []
    for code, entries in suite["families"].items():
        fam = get_family(code)
        for knobs in entries:
            knobs = dict(knobs)
            n = int(knobs.pop("n", 1))
            try:
                got = fam.generate(suite["seed"], n, **knobs)
            except TypeError as e:
                raise AgentHarnessError(f"family {code}: bad knob in the suite config ({e})") from None
            if len(got) < n:
                raise AgentHarnessError(f"family {code} produced {len(got)} of {n} valid tasks for {knobs}; "
                                        "relax the knobs or lower n")
            tasks.extend(got)
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise AgentHarnessError("duplicate task ids in the suite; give each family entry different knobs")
    return tasks


def load_suite(name: str, config: Path | None = None, regenerate: bool = False) -> list[AgentTask]:
    """The suite's tasks, from the cache when present (written atomically after generation)."""
    suite = load_suite_config(name, config)
    path = cache_dir() / f"{name}-{suite_key(name, suite)}.jsonl"
    if path.is_file() and not regenerate:
        return [AgentTask.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    tasks = generate_suite(suite)
    write_tasks(tasks, path)
    return tasks


def write_tasks(tasks: list[AgentTask], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text("".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in tasks))
    os.replace(tmp, path)


def find_task(tasks: list[AgentTask], ref: str) -> AgentTask:
    fam, _, tid = ref.partition(":")
    if not tid and ref.upper() in {"A", "B", "C", "D"}:
        for t in tasks:
            if t.family == ref.upper():
                return t
        raise UnknownTaskError(f"the suite has no family {ref.upper()} task")
    want = tid or ref
    for t in tasks:
        if t.id == want:
            return t
    known = ", ".join(t.id for t in tasks[:12]) + (" ..." if len(tasks) > 12 else "")
    raise UnknownTaskError(f"unknown task id {want!r}; known: {known} (see `msa-eval agent list`)")
