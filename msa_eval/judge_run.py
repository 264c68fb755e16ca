"""The judge pass over a run directory: after generation, every ok record of an open-ended
task (`Task.open_ended`: summaries, free-form long-doc QA) gets a `judge` dict:

    {"judge": "local:smollm2-135m", "rubric": "v1", "status": "ok" | "unparsed" | "error",
     "score": 0..3 | None, "scale_max": 3, "normalized": score / 3 | None,
     "raw": the judge's reply ("Score:" + continuation for local judges), "error": str | None}

Resumable and cached like the rest: a record whose judge dict has the same judge name and
rubric and status ok/unparsed is never judged again; after each batch records.jsonl is
rewritten atomically (temp file + os.replace), so a kill loses at most the batch in flight;
openai judges also keep their response cache in `<run dir>/cache`. The headline `score` is
never touched.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from msa_common.atomic import atomic_write_text
from msa_eval.backends.base import Backend, GenRequest
from msa_eval.judge import JUDGE_MAX_TOKENS, RUBRIC_VERSION, SCALE_MAX, judge_key, judge_messages, parse_judge_score
from msa_eval.runner.config import BackendSpec
from msa_eval.runner.manifest import RECORDS, read_manifest, save_manifest
from msa_eval.runner.records import SampleRecord, repair_records
from msa_eval.runner.requests import prefill_text
from tasks.base import Sample

SCORE_PREFILL = "Score:"


def open_ended_tasks() -> set[str]:
    from tasks.registry import all_tasks

    return {name for name, cls in all_tasks().items() if getattr(cls, "open_ended", False)}


def needs_judging(r: SampleRecord, key: str, tasks: set[str]) -> bool:
    if r.task not in tasks or r.status != "ok" or r.output is None:
        return False
    j = r.judge or {}
    return not (j.get("judge") == key and j.get("rubric") == RUBRIC_VERSION
                and j.get("status") in ("ok", "unparsed"))


def judge_run(
    run_dir: Path, samples: dict[str, Sample], spec: BackendSpec,
    factory: Callable[[BackendSpec], Backend], batch: int = 4,
    progress: Callable[..., None] | None = None,
) -> dict[str, int]:
    """Judge the pending records of `run_dir` (samples by id give question and reference).
    Returns counts {judged, skipped, errors}."""
    key = judge_key(spec)
    if spec.kind == "openai" and "cache_dir" not in spec.options:
        spec = replace(spec, options={**spec.options, "cache_dir": str(run_dir / "cache")})
    path = run_dir / RECORDS
    emit = progress or (lambda *a, **k: None)
    records, repair = repair_records(path)  # it rewrites the file below: unreadable lines go to the sidecar first
    if repair is not None:
        emit("notice", message=repair.notice(path))
    tasks = open_ended_tasks()
    todo = [i for i, r in enumerate(records) if needs_judging(r, key, tasks) and r.sample_id in samples]
    counts = {"judged": 0, "skipped": sum(1 for r in records if r.task in tasks) - len(todo), "errors": 0}
    manifest = read_manifest(run_dir) or {}
    manifest.setdefault("judge", {})[key] = {"rubric": RUBRIC_VERSION, "spec": spec.kind,
                                             "model": spec.model, "base_url": spec.base_url}
    save_manifest(run_dir, manifest)
    if not todo:
        return counts
    emit("backend", key=f"judge {key}", total=len(todo), done=0)
    backend = factory(spec)
    try:
        for start in range(0, len(todo), max(1, batch)):
            idx = todo[start:start + max(1, batch)]
            tok = getattr(backend, "tokenizer", None)
            reqs = [_request(records[i], samples[records[i].sample_id], tok) for i in idx]
            results = backend.generate(reqs)
            for i, res in zip(idx, results, strict=True):  # one result per request
                raw = (SCORE_PREFILL + res.text) if tok is not None and not res.error else res.text
                records[i] = records[i].model_copy(update={"judge": _verdict(key, raw, res.error)})
                counts["errors" if res.error else "judged"] += 1
            atomic_write_text(path, "".join(r.model_dump_json() + "\n" for r in records))
            emit("advance", key=f"judge {key}", n=len(idx))
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
    return counts


def _request(r: SampleRecord, s: Sample, tok: Any = None) -> GenRequest:
    """The rubric as a chat; a judge with its own tokenizer (local) gets the reply opened
    with "Score:" (an assistant prefill, as the needle tasks do), so a small model answers
    in the format; endpoints get the plain chat (the OpenAI API cannot prefill)."""
    msgs = judge_messages(s.category, s.metadata.get("question"), s.answers, r.output or "")
    base: dict[str, Any] = dict(id=f"judge-{r.backend}-{r.sample_id}", max_tokens=JUDGE_MAX_TOKENS,
                                temperature=0.0, seed=0)
    if tok is not None:
        return GenRequest(prompt=prefill_text(msgs + [{"role": "assistant", "content": SCORE_PREFILL}], tok),
                          **base)
    return GenRequest(messages=msgs, **base)


def _verdict(key: str, text: str | None, error: str | None) -> dict[str, Any]:
    score = None if error else parse_judge_score(text)
    status = "error" if error else ("ok" if score is not None else "unparsed")
    return {"judge": key, "rubric": RUBRIC_VERSION, "status": status, "score": score,
            "scale_max": SCALE_MAX, "normalized": None if score is None else round(score / SCALE_MAX, 4),
            "raw": text, "error": error}
