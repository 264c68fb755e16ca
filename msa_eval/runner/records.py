"""One JSONL record per (backend, sample): the pydantic edge of a run's results.

Appends are flushed and fsynced per batch. Readers (`read_records`, the report) never write:
they skip a line cut by a kill -9 and any unreadable line, and say how many they skipped.
Only the runner repairs (`repair_records`, when it reopens a run directory): the unreadable
lines' exact bytes are appended to `records.jsonl.bad`, then the file is rewritten
atomically with the good lines byte for byte, so nothing is lost and their samples run again."""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from msa_common.atomic import atomic_write_bytes


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
    queue_s: float | None = None  # waiting before the prefill: msa-eval serve's split, or the local engine's
    prefill_s: float | None = None
    decode_s: float | None = None
    attention_density: float | None = None
    peak_mem_bytes: int | None = None
    cost_usd: float | None = None  # openai backend: from the price table (None: the model's price is unknown)
    error: str | None = None
    # how the prompt went out: completion | chat | chat-prefill | chat-prefill-ref |
    # chat-prefix-in-user (runner/requests.py); None in records written before it existed
    prompt_format: str | None = None
    task_version: str | None = None  # the generator's version where the task has one (mrcr, graphwalks)
    # optional judge (msa_eval/judge.py): never part of `score`, the category means or the overall
    judge: dict[str, Any] | None = None
    # local MSA arms: what the indexer chose (engine/msa/telemetry.py: per layer and KV group); None elsewhere
    msa_telemetry: dict[str, Any] | None = None
    # local backend: what its K/V cache held (fp8, bf16, fp16, fp32); None elsewhere and in older records
    kv_cache_dtype: str | None = None


BAD_SUFFIX = ".bad"  # records.jsonl.bad: the exact bytes of the lines a repair took out


@dataclass
class RecordScan:
    """What a tolerant read of records.jsonl found. `good` keeps each readable line's bytes."""

    records: list[SampleRecord] = field(default_factory=list)
    good: list[bytes] = field(default_factory=list)
    partial: bytes | None = None  # the unreadable last line with no newline (a kill -9 mid-append)
    bad: list[bytes] = field(default_factory=list)  # other unreadable lines (garbled, not a record)
    unterminated: bool = False  # the file's last byte is not a newline (the next append would glue on)

    @property
    def unreadable(self) -> int:
        return len(self.bad) + (self.partial is not None)


def scan_records(path: Path) -> RecordScan:
    """Read `path` without writing: every line that is a valid record, the rest set aside."""
    scan = RecordScan()
    if not path.is_file():
        return scan
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    scan.unterminated = tail != b""
    for i, line in enumerate(lines + ([tail] if tail else [])):
        if not line.strip():
            continue
        try:
            rec = SampleRecord.model_validate_json(line)
        except ValueError:  # pydantic's ValidationError (bad JSON, bad bytes, not a record)
            if i == len(lines):
                scan.partial = line
            else:
                scan.bad.append(line)
            continue
        scan.records.append(rec)
        scan.good.append(line)
    return scan


def read_records(path: Path) -> list[SampleRecord]:
    """All readable records of `path`; never writes (a running run may be appending)."""
    return scan_records(path).records


@dataclass(frozen=True)
class Repair:
    partial: int  # 0 or 1: a cut last line
    bad: int  # garbled lines
    sidecar: Path

    def notice(self, path: Path) -> str:
        parts = [f"dropped {self.partial} partial record"] if self.partial else []
        if self.bad:
            parts.append(f"set aside {self.bad} unreadable line{'s' * (self.bad > 1)}")
        return (f"{path}: {', '.join(parts)} (exact bytes kept in {self.sidecar}); "
                "their samples run again")


def repair_records(path: Path) -> tuple[list[SampleRecord], Repair | None]:
    """The runner's repair on reopening a run: unreadable lines go (appended, fsynced) to the
    `.bad` sidecar, then `path` is rewritten atomically with the good lines' bytes unchanged.
    Returns the records and what was repaired (None when the file was clean)."""
    scan = scan_records(path)
    if not scan.unreadable:
        if scan.unterminated:  # a whole record whose newline never made it: end the line
            with open(path, "ab") as f:
                f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
        return scan.records, None
    sidecar = path.with_name(path.name + BAD_SUFFIX)
    with open(sidecar, "ab") as f:
        f.write(b"".join(line + b"\n" for line in scan.bad + ([scan.partial] if scan.partial else [])))
        f.flush()
        os.fsync(f.fileno())
    atomic_write_bytes(path, b"".join(line + b"\n" for line in scan.good))
    return scan.records, Repair(int(scan.partial is not None), len(scan.bad), sidecar)


def append_records(path: Path, records: Iterable[SampleRecord]) -> None:
    data = "".join(r.model_dump_json() + "\n" for r in records)
    if not data:
        return
    with open(path, "a") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
