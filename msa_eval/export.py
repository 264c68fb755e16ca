"""A run's records as a Hugging Face `datasets.Dataset`: one row per (backend, sample), written as
a `save_to_disk` folder (`hf`), a parquet file or a JSON-lines file. Schema: docs/records.md.
(`inspect`, the records as inspect-ai eval logs, is `msa_eval.inspect_log`; it writes through
`write_output` too.)

Flat fields become typed columns and `answers` a list of strings; the dict-valued fields
(`metrics`, `judge`, `msa_telemetry`, and `extra` for fields beyond the schema) are JSON
strings. Their keys differ per task (metrics), per judge and per model (telemetry: one entry
per layer and KV group), so as Arrow structs every export would get its own schema, keys
missing in a row would come back as nulls rather than absent, and jsonl readers would infer
yet another type; a JSON string reads back equal with `json.loads` in every format. Floats
are exact in `hf` and parquet; `jsonl` goes through pandas' `to_json`, which writes at most 15
decimal places (an absolute error below 1e-15).

The output is written to a temporary sibling of PATH and renamed into place only once it is
complete, so an existing PATH (replaced with `force`) is never left half-written.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msa_common.atomic import fsync_quietly
from msa_eval.errors import MsaEvalError
from msa_eval.runner.records import SampleRecord

FORMATS = ("parquet", "jsonl", "hf")


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # "string" | "int64" | "float64" | "bool" | "list<string>" | "json" (a JSON string)
    meaning: str


# One entry per SampleRecord field (tests/msa_eval/test_export.py checks the two agree), plus `extra`.
COLUMNS: tuple[Column, ...] = (
    Column("backend", "string", "backend key of the arm, e.g. local:msa, local:dense, openai:gpt-4o"),
    Column("sample_id", "string", "task/length/index, unique per backend"),
    Column("task", "string", "task name (`msa-eval tasks list`)"),
    Column("category", "string", "HELMET category of the task (recall, rag, ...)"),
    Column("length", "int64", "target prompt length in tokens of the reference tokenizer"),
    Column("mode", "string", "chat or completion"),
    Column("status", "string", "ok, or error: the harness or backend failed (scored 0, retried on resume)"),
    Column("prompt_hash", "string", "hash of the prompt sent; equal across arms for the same sample"),
    Column("prompt_tokens_ref", "int64", "prompt tokens counted by the reference tokenizer"),
    Column("prompt_tokens", "int64", "prompt tokens counted by the backend (null: not reported)"),
    Column("completion_tokens", "int64", "tokens generated (null: not reported)"),
    Column("truncated_tokens", "int64", "prompt tokens cut to fit the backend's context"),
    Column("depth", "float64", "needle depth in the context, 0-1 (null: the task has none)"),
    Column("answers", "list<string>", "the reference answers"),
    Column("output", "string", "the model's raw output (null: none, e.g. on error)"),
    Column("parsed", "string", "the answer extracted from the output for scoring"),
    Column("score", "float64", "the sample's score under `metric`, 0-1 (the report shows 0-100)"),
    Column("metric", "string", "name of the task's primary metric"),
    Column("metrics", "json", "object: every metric the task computed, name -> value ({} when none)"),
    Column("extraction_failed", "bool", "the answer could not be extracted from the output"),
    Column("finish_reason", "string", "stop, length, ... as the backend reported it"),
    Column("latency_s", "float64", "request wall time, seconds"),
    Column("ttft_s", "float64", "time to first token, seconds"),
    Column("queue_s", "float64", "time waiting before the prefill (msa-eval serve and the local engine report it)"),
    Column("prefill_s", "float64", "prefill time, seconds"),
    Column("decode_s", "float64", "decode time, seconds"),
    Column("attention_density", "float64", "keys read / keys a dense pass reads (null: not reported)"),
    Column("peak_mem_bytes", "int64", "peak memory the backend reported, bytes (null: none)"),
    Column("cost_usd", "float64", "request cost from the price table (null: unknown price or local)"),
    Column("error", "string", "the error line when status is error"),
    Column("prompt_format", "string", "how the prompt went out: completion, chat, chat-prefill, ..."),
    Column("task_version", "string", "the task generator's version where the task has one"),
    Column("judge", "json", "object: the optional LLM judge's verdict (null: not judged)"),
    Column("msa_telemetry", "json", "object: what the MSA indexer chose, per layer and KV group (null: no MSA arm)"),
    Column("kv_cache_dtype", "string", "the local engine's K/V cache dtype: fp8, bf16, fp16 or fp32 (null: not local)"),
    Column("extra", "json", "object: record fields beyond this schema, name -> value (null: none)"),
)
_JSON = tuple(c.name for c in COLUMNS if c.dtype == "json")
_FIELDS = tuple(c.name for c in COLUMNS if c.name != "extra")


def _features(ds_mod: Any) -> Any:
    def feature(dtype: str) -> Any:
        if dtype == "list<string>":
            return ds_mod.Sequence(ds_mod.Value("string"))
        return ds_mod.Value("string" if dtype == "json" else dtype)

    return ds_mod.Features({c.name: feature(c.dtype) for c in COLUMNS})


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def to_row(rec: SampleRecord) -> dict[str, Any]:
    """One record as one row of the schema (dict fields as JSON strings)."""
    row = rec.model_dump(include=set(_FIELDS))
    for name in _JSON:
        if name in row:
            row[name] = _json(row[name])
    row["extra"] = _json(rec.model_extra or None)
    return row


def from_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row read back (from any of the formats) as the record's fields: JSON strings parsed,
    `extra` merged in. `SampleRecord.model_validate(from_row(row))` is the record again."""
    out = {k: (json.loads(v) if k in _JSON and v is not None else v) for k, v in row.items()}
    return {k: v for k, v in out.items() if k != "extra"} | (out.get("extra") or {})


def records_dataset(records: list[SampleRecord]) -> Any:  # datasets.Dataset
    ds_mod = import_datasets()
    return ds_mod.Dataset.from_list([to_row(r) for r in records], features=_features(ds_mod))


def import_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise MsaEvalError("export needs the `datasets` package: pip install datasets "
                           "(or pip install 'msa-eval[data]')") from None
    return datasets


def write_dataset(ds: Any, fmt: str, path: Path, force: bool = False) -> Path:
    """Write `ds` to `path` as `fmt`; an existing `path` is refused unless `force`, and then
    replaced only after the new output is complete."""
    if fmt not in FORMATS:
        raise MsaEvalError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")

    def write(tmp: Path) -> None:
        if fmt == "hf":
            ds.save_to_disk(str(tmp))
        elif fmt == "parquet":
            ds.to_parquet(str(tmp))
        else:
            ds.to_json(str(tmp), lines=True, force_ascii=False, double_precision=15)  # pandas' most

    return write_output(path, write, force)


def write_output(path: Path, write: Callable[[Path], None], force: bool = False) -> Path:
    """`write(tmp)` a file or folder at a temporary sibling of `path`, then rename it to `path`:
    an existing `path` is refused unless `force`, and replaced only once the new output is complete."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not force:
        raise MsaEvalError(f"{path} exists: pass --force to replace it, or choose another --out")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "tmp")
    try:
        write(tmp)
        _fsync_tree(tmp)
        _replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return path


def _sibling(path: Path, kind: str) -> Path:
    """An unused name beside `path` (same directory: the rename stays on one file system)."""
    while True:
        p = path.with_name(f".{path.name}.{secrets.token_hex(4)}.{kind}")
        if not (p.exists() or p.is_symlink()):
            return p


def _replace(new: Path, path: Path) -> None:
    """Put `new` at `path`. A file over a file is one os.replace; otherwise the old output is
    moved aside, the new one renamed in, and the old one deleted (moved back if the rename fails)."""
    if not (path.exists() or path.is_symlink()) or (new.is_file() and path.is_file() and not path.is_symlink()):
        os.replace(new, path)
    else:
        old = _sibling(path, "old")
        os.replace(path, old)
        try:
            os.replace(new, path)
        except BaseException:
            os.replace(old, path)
            raise
        _remove(old)
    fsync_quietly(path.parent)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _fsync_tree(p: Path) -> None:
    for f in [p, *p.rglob("*")] if p.is_dir() else [p]:
        fsync_quietly(f)
