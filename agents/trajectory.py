"""Append-only JSONL trajectories, written after every step, and their reader for resume.

Lines (each one JSON object, `type` first):
  header  schema, harness version, task id/hash/family, config + config hash, backend,
          token counting method, initial messages
  step    step index, the messages this step appended to the full history (assistant reply and
          tool results), raw response (content, tool calls, finish reason), per-call usage
          (prompt/completion tokens, cost), latency, context tokens sent, observations, format
          error flag, elapsed seconds, counters, and the environment checkpoint when it changed
  event   context-policy events (truncate-observations, summarize) with their details
  result  exit status, score, grade details, metrics
Trajectories converted from an outside harness (`agents/converters/`) have the same lines; their header
adds `external` (harness, version, source format) and their step usage `cached_tokens` where reported.
A crash can only lose the line being written; the reader drops a trailing partial line.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.errors import AgentHarnessError
from msa_common.atomic import atomic_write_text

SCHEMA = "msa-eval.agent-trajectory/1"


class TrajectoryWriter:
    def __init__(self, path: Path, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not append and self.path.exists():
            self.path.unlink()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str, ensure_ascii=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


@dataclass
class Trajectory:
    header: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None

    def history(self) -> list[dict[str, Any]]:
        """The full message history (initial messages + every step's appended messages)."""
        msgs = list(self.header["messages"])
        for s in self.steps:
            msgs.extend(s["messages"])
        return msgs

    def last_checkpoint(self) -> dict[str, Any] | None:
        for s in reversed(self.steps):
            if "checkpoint" in s:
                return s["checkpoint"]
        return None


def read_trajectory(path: Path, repair: bool = False) -> Trajectory:
    """Parse a trajectory file; a torn last line (crash mid-write) is skipped. With `repair` (resume,
    which appends next) the file is cut back to its last whole line; a reader (`agent show`) never
    writes."""
    path = Path(path)
    if not path.is_file():
        raise AgentHarnessError(f"no trajectory at {path}; pass the .jsonl file written by `agent run`")
    data = path.read_bytes()
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as e:  # lines are written with ensure_ascii=False: a kill can cut a character
        if b"\n" in data[e.start:].rstrip(b"\n"):
            raise AgentHarnessError(f"{path} holds bytes that are not UTF-8 (offset {e.start}) before its last "
                                    "line; the trajectory is corrupt: run the task again with a new --out") from None
        raw = data.decode("utf-8", errors="surrogateescape")  # only the torn last line: dropped below
    lines = raw.split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # torn final line
                if repair and records:
                    _truncate_to_valid(path, raw, line)
                break
            raise AgentHarnessError(f"{path} line {i + 1} is not JSON; the trajectory is corrupt") from None
    if not records or records[0].get("type") != "header":
        raise AgentHarnessError(f"{path} has no header line; it is not an msa-eval trajectory")
    if records[0].get("schema") != SCHEMA:
        raise AgentHarnessError(f"{path} has schema {records[0].get('schema')!r}, expected {SCHEMA!r}")
    t = Trajectory(header=records[0])
    for r in records[1:]:
        kind = r.get("type")
        if kind == "step":
            t.steps.append(r)
        elif kind == "event":
            t.events.append(r)
        elif kind == "result":
            t.result = r
    return t


def _truncate_to_valid(path: Path, raw: str, torn: str) -> None:
    keep = raw[: raw.rfind(torn)]
    atomic_write_text(path, keep)
