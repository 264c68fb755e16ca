"""The run loop: plan -> run directory -> per backend, pending samples -> `Backend.generate_stream`
(`concurrency` requests in flight, each record written as its request finishes) or `Backend.generate` in
batches of `concurrency` -> score -> append records (fsynced) -> manifest.

Resume: a (backend, sample) pair with an `ok` record is never generated again; `error`
records are retried; unreadable lines of records.jsonl are repaired away (to the `.bad`
sidecar, records.py) with a one-line notice. Interrupted runs leave status "interrupted" in
the manifest. A new run that fails before its first record (a backend that cannot be built or
is refused: bad option, key, model id) removes what it created, so the corrected command
can use the same --out."""
from __future__ import annotations

import contextlib
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msa_eval.backends.base import Backend, BackendError, GenResult
from msa_eval.runner.config import BackendSpec, ConfigError, RunConfig
from msa_eval.runner.manifest import MANIFEST, RECORDS, open_run_dir, save_manifest
from msa_eval.runner.plan import PlannedTask
from msa_eval.runner.records import Repair, SampleRecord, append_records, repair_records
from msa_eval.runner.requests import to_request
from tasks.base import Sample, TokenCounter

BackendFactory = Callable[[BackendSpec], Backend]
MAX_ERROR_STREAK = 3  # consecutive failed requests that stop a run (harness error, not data)
# progress(event, **info): event in {"notice", "backend", "advance", "done"}
Progress = Callable[..., None]


@dataclass
class RunResult:
    run_dir: Path
    manifest: dict[str, Any]
    records: list[SampleRecord]
    generated: int = 0
    skipped: int = 0
    errors: int = 0
    backends: list[str] = field(default_factory=list)
    repair: Repair | None = None  # what reopening repaired in records.jsonl


def default_factory(spec: BackendSpec) -> Backend:
    from msa_eval.backends.factory import make_backend

    if spec.kind == "local":
        return make_backend("local", model=spec.model, attention=spec.attention or "dense", **spec.options)
    return make_backend(spec.kind, base_url=spec.base_url, model=spec.model, **spec.options)


def to_record(key: str, s: Sample, r: GenResult, prompt_format: str | None = None) -> SampleRecord:
    failed = r.finish_reason == "error" or r.error is not None
    sc = s.score(None if failed else r.text)
    extra = {k: float(v) for k, v in sc.items()
             if k not in ("score", "metric", "parsed", "extraction_failed") and isinstance(v, (int, float))}
    return SampleRecord(
        backend=key, sample_id=s.id, task=s.task, category=s.category,
        length=s.metadata["target_length"], mode=s.mode, status="error" if failed else "ok",
        prompt_hash=s.prompt_hash(), prompt_tokens_ref=s.metadata["prompt_tokens"],
        prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
        truncated_tokens=s.metadata.get("truncated_tokens", 0), depth=s.metadata.get("depth"),
        answers=s.answers, output=None if failed else r.text, parsed=sc.get("parsed"),
        score=float(sc["score"]), metric=sc["metric"], metrics=extra,
        extraction_failed=bool(sc["extraction_failed"]), finish_reason=r.finish_reason,
        latency_s=r.latency_s, ttft_s=r.ttft_s, queue_s=r.queue_s, prefill_s=r.prefill_s, decode_s=r.decode_s,
        attention_density=r.extra.get("attention_density"),
        peak_mem_bytes=r.extra.get("peak_mem_bytes"), cost_usd=r.extra.get("cost_usd"), error=r.error,
        prompt_format=prompt_format,
        task_version=s.metadata.get("task_version"),
        msa_telemetry=r.extra.get("msa_telemetry"), kv_cache_dtype=r.extra.get("kv_cache_dtype"),
    )


def run_suite(
    cfg: RunConfig, run_dir: Path, plan: list[PlannedTask], reference: dict[str, Any],
    factory: BackendFactory = default_factory, progress: Progress | None = None,
    reference_tokenizer: TokenCounter | None = None,
) -> RunResult:
    """Generate and score every (backend, sample) pair without an ok record. The reference
    tokenizer renders assistant-prefill chats for backends without their own (requests.py)."""
    existed, had_manifest = run_dir.exists(), (run_dir / MANIFEST).is_file()
    manifest = open_run_dir(run_dir, cfg, reference)
    samples = [s for p in plan for s in p.samples]
    manifest["plan"] = {"samples": len(samples), "tasks": sorted({s.task for s in samples}),
                        "lengths": sorted({p.length for p in plan})}
    save_manifest(run_dir, manifest)
    path = run_dir / RECORDS
    records, repair = repair_records(path)
    done = {(r.backend, r.sample_id) for r in records if r.status == "ok"}
    result = RunResult(run_dir, manifest, records, repair=repair)
    emit = progress or (lambda *a, **k: None)
    if repair is not None:
        manifest.setdefault("events", []).append({"repaired": repair.notice(path)})
        save_manifest(run_dir, manifest)
        emit("notice", message=repair.notice(path))
    try:
        for spec in cfg.backends:
            key = spec.key
            result.backends.append(key)
            pending = [s for s in samples if (key, s.id) not in done]
            result.skipped += len(samples) - len(pending)
            emit("backend", key=key, total=len(samples), done=len(samples) - len(pending))
            if not pending:
                continue
            t0 = time.perf_counter()
            backend = factory(spec)
            manifest["backends"][key] = {**backend.describe(), "load_s": time.perf_counter() - t0}
            save_manifest(run_dir, manifest)
            streak = 0
            for new in _generated(backend, key, pending, cfg.concurrency, reference_tokenizer):
                append_records(path, new)
                records.extend(new)
                result.generated += len(new)
                result.errors += sum(r.status == "error" for r in new)
                emit("advance", key=key, n=len(new))
                streak = 0 if any(r.status == "ok" for r in new) else streak + len(new)
                if streak >= min(MAX_ERROR_STREAK, len(pending)):
                    raise BackendError(
                        f"{key}: {streak} requests in a row failed ({new[-1].error}); fix the backend "
                        "and rerun the same command: finished samples are kept")
            manifest["backends"][key]["peak_rss_bytes"] = \
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            close = getattr(backend, "close", None)
            if callable(close):
                close()
            del backend
            save_manifest(run_dir, manifest)
    except KeyboardInterrupt:
        manifest["status"] = "interrupted"
        save_manifest(run_dir, manifest)
        raise
    except (BackendError, ConfigError) as e:
        if not had_manifest and not path.exists():
            _remove_new_run(run_dir, existed)
            raise type(e)(f"{e} (nothing was recorded: the new run directory was removed)") from None
        manifest["status"] = "error"
        manifest["error"] = str(e)
        save_manifest(run_dir, manifest)
        raise
    except Exception as e:
        manifest["status"] = "error"
        manifest["error"] = f"{type(e).__name__}: {e}"
        save_manifest(run_dir, manifest)
        raise
    manifest["status"] = "complete" if result.errors == 0 else "complete_with_errors"
    manifest["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save_manifest(run_dir, manifest)
    emit("done")
    result.records = records
    return result


def _generated(backend: Backend, key: str, pending: list[Sample], concurrency: int,
               reference_tokenizer: TokenCounter | None) -> Iterator[list[SampleRecord]]:
    """The records of `pending`, in groups as they are done: one record per finished request from a backend
    that streams (`generate_stream`: the local engine, `concurrency` requests held at once, no batch waiting
    for its slowest member), one batch of `concurrency` at a time from the others."""
    n = max(1, concurrency)
    stream = getattr(backend, "generate_stream", None)
    if callable(stream):
        sent = {s.id: (s, *to_request(s, backend, reference_tokenizer)) for s in pending}
        with contextlib.closing(stream((req for _, req, _ in sent.values()), window=n)) as results:
            for r in results:
                s, _, fmt = sent[r.id]
                yield [to_record(key, s, r, fmt)]
        return
    for i in range(0, len(pending), n):
        batch = pending[i:i + n]
        reqs = [to_request(s, backend, reference_tokenizer) for s in batch]
        results = backend.generate([req for req, _ in reqs])
        yield [to_record(key, s, r, fmt) for s, r, (_, fmt) in zip(batch, results, reqs, strict=True)]


def _remove_new_run(run_dir: Path, existed: bool) -> None:
    """Undo what this invocation created: the whole directory if it made it, else only the
    manifest it wrote into an (empty) directory that was already there. No record exists, so
    the response cache holds nothing either (it stores successes, each followed by a record)."""
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        (run_dir / MANIFEST).unlink(missing_ok=True)
