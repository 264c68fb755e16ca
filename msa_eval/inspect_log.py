"""A run's records as inspect-ai eval logs (`msa-eval export RUN --format inspect --out DIR`):
one `.eval` log per backend in DIR, built from inspect_ai's own log classes and written with its
`write_eval_log`, so `inspect_ai.log.read_eval_log` reads each back and `inspect view --log-dir DIR`
lists them side by side (one model per log is inspect's shape; our runs hold several arms).

Per log: task = the suite's name, model = `msa-eval/<backend key>` (e.g. msa-eval/local:dense;
the backend's manifest entry is in `model_args`), one sample per record (id = sample_id, epoch 1),
target = the reference answers, output = the model's raw output, one score named after the
task's metric (value = our 0-1 score, answer = the parsed answer, every metric in its metadata),
and results = inspect's own `mean()` and `stderr()` of those scores per metric. The record itself
is the sample's metadata, whole: `SampleRecord.model_validate(sample.metadata)` is the record again.

Limits: records keep a prompt's hash, not its text, so a sample's input is a line naming the hash
(`msa-eval run ... --dry-run --json` rebuilds the prompts); an error record (status error) is an
inspect sample with `error` set and its score of 0, as our reports count it. The log format is
inspect-ai's (version 2 at inspect-ai 0.3.x); a newer inspect-ai reads older logs, an older one
may not read a newer writer's (docs/records.md).
"""
from __future__ import annotations

import hashlib
import re
from importlib import metadata as pkg_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msa_eval.errors import MsaEvalError
from msa_eval.export import write_output
from msa_eval.runner.records import SampleRecord

if TYPE_CHECKING:
    from inspect_ai.log import EvalStatus
    from inspect_ai.model import StopReason

_STATUS: dict[str, EvalStatus] = {"complete": "success", "complete_with_errors": "success", "running": "started",
           "interrupted": "cancelled", "error": "error"}
_STOP: dict[str, StopReason] = {"stop": "stop", "length": "max_tokens", "tool_calls": "tool_calls"}


def import_inspect() -> Any:
    try:
        import inspect_ai.log
    except ImportError:
        raise MsaEvalError("export --format inspect needs inspect-ai: pip install 'msa-eval[inspect]' "
                           "(or pip install inspect-ai)") from None
    return inspect_ai.log


def write_inspect_logs(records: list[SampleRecord], manifest: dict[str, Any], run_dir: Path, path: Path,
                       force: bool = False) -> Path:
    """Write one `.eval` log per backend of `records` into the folder `path` (refused when it
    exists unless `force`; replaced only once every log is written)."""
    log_mod = import_inspect()
    by_backend: dict[str, list[SampleRecord]] = {}
    for r in records:
        by_backend.setdefault(r.backend, []).append(r)
    logs = {backend: eval_log(recs, manifest, run_dir) for backend, recs in by_backend.items()}

    def write(tmp: Path) -> None:
        tmp.mkdir()
        for backend, log in logs.items():
            log_mod.write_eval_log(log, str(tmp / log_name(log.eval.task, backend)), format="eval")

    return write_output(path, write, force)


def log_name(task: str, backend: str) -> str:
    return f"{_slug(task)}_{_slug(backend)}.eval"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def eval_log(records: list[SampleRecord], manifest: dict[str, Any], run_dir: Path) -> Any:  # inspect EvalLog
    """The inspect EvalLog of one backend's records."""
    import inspect_ai.log as il
    from inspect_ai.model import ModelUsage

    backend = records[0].backend
    model = f"msa-eval/{backend}"
    suite = ((manifest.get("config") or {}).get("suite") or {}).get("name") or run_dir.name
    created = manifest.get("created") or ""
    samples = [_sample(r, model) for r in records]
    usage = ModelUsage(input_tokens=sum(r.prompt_tokens or 0 for r in records),
                       output_tokens=sum(r.completion_tokens or 0 for r in records))
    usage.total_tokens = usage.input_tokens + usage.output_tokens
    git = manifest.get("git") or {}
    eval_id = hashlib.sha256(f"{manifest.get('config_hash')}|{backend}".encode()).hexdigest()[:22]
    spec = il.EvalSpec(
        eval_id=eval_id, run_id=str(manifest.get("config_hash") or ""), created=created, task=suite,
        task_id=str(manifest.get("config_hash") or ""), dataset=il.EvalDataset(
            name=suite, location=str(run_dir), samples=len(samples), sample_ids=[s.id for s in samples]),
        model=model, model_base_url=(manifest.get("backends", {}).get(backend) or {}).get("base_url"),
        model_args=manifest.get("backends", {}).get(backend) or {}, config=il.EvalConfig(epochs=1),
        revision=il.EvalRevision(type="git", origin="", commit=git["commit"], dirty=git.get("dirty"))
        if git.get("commit") else None,
        packages=_packages(),
        metadata={"msa_eval_run": str(run_dir), "config_hash": manifest.get("config_hash"),
                  "config": manifest.get("config"), "reference_tokenizer": manifest.get("reference_tokenizer"),
                  "seed": manifest.get("seed")})
    stats = il.EvalStats(started_at=created, completed_at=manifest.get("finished") or "",
                         model_usage={model: usage})
    return il.EvalLog(version=2, status=_STATUS.get(str(manifest.get("status")), "started"), eval=spec,
                      plan=il.EvalPlan(name="msa-eval run"), results=_results(samples), stats=stats,
                      samples=samples)


def _sample(r: SampleRecord, model: str) -> Any:  # inspect EvalSample
    import inspect_ai.log as il
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    prompt = (f"prompt {r.prompt_hash} ({r.prompt_tokens_ref} tokens, {r.prompt_format or r.mode}): msa-eval "
              "records keep the prompt's hash, not its text; `msa-eval run ... --dry-run --json` rebuilds it")
    output = ModelOutput.from_content(model, r.output or "", _STOP.get(r.finish_reason or "", "unknown"),
                                      error=r.error)
    if r.prompt_tokens is not None or r.completion_tokens is not None:
        i, o = r.prompt_tokens or 0, r.completion_tokens or 0
        output.usage = ModelUsage(input_tokens=i, output_tokens=o, total_tokens=i + o)
    output.time = r.latency_s
    extra = {k: v for k, v in r.metrics.items() if k != r.metric}
    score = Score(value=r.score, answer=r.parsed, metadata={"extraction_failed": r.extraction_failed, **extra})
    error = il.EvalError(message=r.error or "error", traceback="", traceback_ansi="") if r.status == "error" else None
    return il.EvalSample(
        id=r.sample_id, epoch=1, input=prompt, target=list(r.answers),
        messages=[ChatMessageUser(content=prompt), ChatMessageAssistant(content=r.output or "", model=model)],
        output=output, scores={r.metric: score}, metadata=r.model_dump(mode="json"),
        model_usage={model: output.usage} if output.usage else {}, total_time=r.latency_s,
        working_time=r.latency_s, error=error)


def _results(samples: list[Any]) -> Any:  # inspect EvalResults
    """Per metric name: inspect's mean() and stderr() over the samples scored with it."""
    import inspect_ai.log as il
    from inspect_ai.scorer import SampleScore, mean, stderr

    by_metric: dict[str, list[Any]] = {}
    for s in samples:
        for name, score in (s.scores or {}).items():
            by_metric.setdefault(name, []).append(SampleScore(score=score, sample_id=s.id))
    scores = [il.EvalScore(name=name, scorer=name, scored_samples=len(ss), unscored_samples=0,
                           metrics={m: il.EvalMetric(name=m, value=_number(fn()(ss)))
                                    for m, fn in (("mean", mean), ("stderr", stderr))})
              for name, ss in by_metric.items()]
    return il.EvalResults(total_samples=len(samples), completed_samples=len(samples), scores=scores)


def _number(value: Any) -> float:
    return float(value)  # mean() and stderr() give one number; inspect types a metric's value more widely


def _packages() -> dict[str, str]:
    out = {}
    for pkg in ("msa-eval", "inspect_ai"):
        try:
            out[pkg] = pkg_metadata.version(pkg)
        except pkg_metadata.PackageNotFoundError:
            pass
    return out
