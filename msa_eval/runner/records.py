"""One JSONL record per (backend, sample): the pydantic edge of a run's results.

Appends are flushed and fsynced per batch; a line cut by a kill -9 is dropped (and the
file rewritten atomically without it) when the run directory is opened again."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict


class SampleRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    backend: str  # "local:msa", "openai:gpt-4o", ...
    sample_id: str
    task: str
    category: str
    length: int  # target length (tokens, reference tokenizer)
    mode: Literal["chat", "completion"]
    status: Literal["ok", "error"]  # error = the harness/backend failed (scored 0, retried on resume)
    prompt_hash: str
    prompt_tokens_ref: int  # reference tokenizer
    prompt_tokens: int | None = None  # the backend's own count
    completion_tokens: int | None = None
    truncated_tokens: int = 0
    depth: float | None = None
    answers: list[str]
    output: str | None
    parsed: str | None
    score: float
    metric: str
    metrics: dict[str, float] = {}
    extraction_failed: bool
    finish_reason: str | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    attention_density: float | None = None
    peak_mem_bytes: int | None = None
    error: str | None = None
    # how the prompt went out: completion | chat | chat-prefill | chat-prefill-ref |
    # chat-prefix-in-user (runner/requests.py); None in records written before it existed
    prompt_format: str | None = None
    # optional judge (msa_eval/judge.py): never part of `score`, the category means or the overall
    judge: dict[str, Any] | None = None


def read_records(path: Path) -> list[SampleRecord]:
    """All complete records; a trailing partial line (kill -9 mid-write) is dropped and the
    file is rewritten atomically without it."""
    if not path.is_file():
        return []
    good: list[SampleRecord] = []
    lines = path.read_text().splitlines(keepends=True)
    bad = False
    for line in lines:
        if not line.endswith("\n"):
            bad = True
            continue
        try:
            good.append(SampleRecord.model_validate_json(line))
        except ValueError:
            bad = True
    if bad:
        atomic_write_text(path, "".join(r.model_dump_json() + "\n" for r in good))
    return good


def append_records(path: Path, records: Iterable[SampleRecord]) -> None:
    data = "".join(r.model_dump_json() + "\n" for r in records)
    if not data:
        return
    with open(path, "a") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")
