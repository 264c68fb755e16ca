"""Batch runs of an agent suite: a worker pool, one record per finished task, resume.

Run directory layout (documented for the report in agents/RECORDS.md):
  manifest.json           run identity (suite, suite key, task ids + hashes, agent config +
                          hash, backend description, versions, git commit), status, times
  records.jsonl           one JSON line per task that reached an exit status (AgentResult +
                          task hash, config hash, backend key, knobs); appended under a lock
  trajectories/<id>.jsonl the step-by-step trajectory of each task

Resume: tasks with a record are skipped; a task with a trajectory but no record continues
from its trajectory; a changed config or task hash refuses to resume (new --out needed).
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.config import TERMINAL_STATUSES, AgentConfig
from agents.errors import AgentHarnessError
from agents.families import canonical_task_id
from agents.run_one import run_task
from agents.task import AgentTask
from msa_common import __version__
from msa_common.atomic import atomic_write_json

RUN_SCHEMA = "msa-eval.agent-run/1"


@dataclass
class BatchSummary:
    run_dir: Path
    ran: int
    skipped: int
    records: list[dict[str, Any]]


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    p = Path(run_dir) / "records.jsonl"
    if not p.is_file():
        return []
    out = []
    for line in p.read_bytes().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # JSONDecodeError and UnicodeDecodeError: a torn line from a killed run
            continue
    return out


def _append_line(path: Path, line: str) -> None:
    """Append one record line, fsynced; a torn last line (kill -9 mid-write) is ended first, so the new
    record never glues onto it (the torn line stays, unreadable and skipped, its task run again)."""
    with open(path, "ab+") as f:
        torn = f.seek(0, os.SEEK_END) > 0 and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n"
        f.write((b"\n" if torn else b"") + line.encode())
        f.flush()
        os.fsync(f.fileno())


def _git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=Path(__file__).resolve().parent)
        return r.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_batch(tasks: list[AgentTask], make_backend: Callable[[AgentTask], Any], backend_key: str,
              backend_info: dict[str, Any], config: AgentConfig, run_dir: Path, suite: str,
              concurrency: int = 1, on_result: Callable[[dict[str, Any]], None] | None = None,
              container: bool = False) -> BatchSummary:
    """Run every task not yet recorded in `run_dir` (resuming partial trajectories)."""
    run_dir = Path(run_dir)
    (run_dir / "trajectories").mkdir(parents=True, exist_ok=True)
    ident: dict[str, Any] = {"suite": suite, "config_hash": config.hash(), "backend": backend_key,
             "tasks": {t.id: t.content_hash() for t in tasks}}
    mpath = run_dir / "manifest.json"
    if mpath.is_file():
        old = json.loads(mpath.read_text())
        for k in ("config_hash", "backend"):
            if old.get(k) != ident[k]:
                raise AgentHarnessError(f"{run_dir} holds a run with a different {k}; use a new --out directory")
        changed = [i for i, h in ident["tasks"].items() if old.get("tasks", {}).get(i, h) != h]
        if changed:
            raise AgentHarnessError(f"{run_dir}: tasks changed since the run began ({changed[:3]}); use a new --out")
        ident["tasks"] = {**old.get("tasks", {}), **ident["tasks"]}
    manifest = {"schema": RUN_SCHEMA, **ident, "config": config.to_dict(), "backend_info": backend_info,
                "sandbox": "docker" if container else "local",
                "versions": {"msa_eval": __version__}, "git_commit": _git_commit(), "status": "running",
                "updated_at": time.time()}
    atomic_write_json(mpath, manifest)
    done = {canonical_task_id(r["task_id"]) for r in read_records(run_dir)  # ids from before the family names too
            if r.get("status") in TERMINAL_STATUSES}
    todo = [t for t in tasks if t.id not in done]
    lock = threading.Lock()
    new: list[dict[str, Any]] = []

    def one(task: AgentTask) -> None:
        traj = run_dir / "trajectories" / f"{task.id}.jsonl"
        try:
            res = run_task(task, make_backend(task), config, traj, resume=traj.exists(), container=container).to_dict()
        except Exception as e:  # noqa: BLE001 - one broken task never crashes the batch
            res = {"task_id": task.id, "family": task.family, "status": "environment_error", "score": 0.0,
                   "error": f"{type(e).__name__}: {e}", "trajectory": str(traj)}
        rec = {"schema": RUN_SCHEMA, **res, "task_hash": task.content_hash(), "config_hash": config.hash(),
               "backend": backend_key, "suite": suite, "knobs": task.knobs, "finished_at": time.time()}
        line = json.dumps(rec, default=str) + "\n"
        with lock:
            _append_line(run_dir / "records.jsonl", line)
            new.append(rec)
            if on_result:
                on_result(rec)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        list(pool.map(one, todo))
    manifest.update(status="complete", updated_at=time.time())
    atomic_write_json(mpath, manifest)
    return BatchSummary(run_dir, len(todo), len(tasks) - len(todo), read_records(run_dir))
