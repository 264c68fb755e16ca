"""Turn `msa-eval run` flags into a typed RunConfig, a plan of samples and a run directory."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.attention.kinds import AttentionKind, uses_indexer
from msa_eval.runner.config import (
    BackendSpec,
    ConfigError,
    Mode,
    RunConfig,
    SuiteConfig,
    TaskEntry,
    load_suite,
    parse_backend_opts,
    parse_lengths,
)
from msa_eval.runner.manifest import check_run_dir
from msa_eval.runner.plan import PlannedTask, build_plan, validate_tasks
from msa_eval.runner.reference import check_lengths, default_lengths, load_reference_tokenizer

DEFAULT_MODEL = "smollm2-135m"


@dataclass
class RunArgs:
    suite: str
    backend: str
    model: str | None
    # the arms, or a string `msa_eval.cli.options.parse_arms` reads; None: the suite's `attention`, else both
    attention: tuple[AttentionKind, ...] | str | None
    base_url: str | None
    reference: str | None
    lengths: str | None
    samples: int | None
    tasks: str | None
    mode: Mode | None
    seed: int | None
    concurrency: int | None
    limit: int | None
    out: Path | None
    backend_opts: tuple[str, ...] = ()
    engine_opts: dict[str, Any] = field(default_factory=dict)  # local backend: --weights etc. (under --backend-opt)
    telemetry: bool = True  # local MSA arms record selection telemetry (engine/msa/telemetry.py)

    def __post_init__(self) -> None:
        from msa_eval.cli.options import parse_arms

        if self.attention is not None:
            self.attention = parse_arms(self.attention)  # type: ignore[assignment]


@dataclass
class Prepared:
    cfg: RunConfig
    plan: list[PlannedTask]
    run_dir: Path
    reference_info: dict[str, Any]
    tokenizer: Any = None  # the reference tokenizer (renders assistant-prefill chats for openai backends)

    @property
    def n_samples(self) -> int:
        return sum(len(p.samples) for p in self.plan)

    def dry_run_rows(self) -> list[dict[str, Any]]:
        rows = []
        for p in self.plan:
            toks = [s.metadata["prompt_tokens"] for s in p.samples]
            rows.append({"task": p.task.name, "category": p.task.category, "length": p.length,
                         "samples": len(p.samples), "prompt_tokens_min": min(toks, default=0),
                         "prompt_tokens_max": max(toks, default=0),
                         "max_tokens": p.samples[0].max_tokens if p.samples else None,
                         "truncated": sum(s.metadata.get("truncated_tokens", 0) > 0 for s in p.samples)})
        return rows


def _arms(a: RunArgs, suite: SuiteConfig) -> tuple[AttentionKind, ...]:
    """--attention when given, else the suite's `attention`, else both (msa, dense)."""
    from msa_eval.cli.options import parse_arms

    if a.attention is not None:
        return a.attention  # type: ignore[return-value]
    try:
        return parse_arms(suite.attention or "both")  # type: ignore[return-value]
    except ValueError as e:
        raise ConfigError(f"suite {suite.name}: attention: {e}") from None


def _backends(a: RunArgs, suite: SuiteConfig) -> tuple[BackendSpec, ...]:
    opts = parse_backend_opts(tuple(a.backend_opts))
    if a.backend == "local":
        model = a.model or DEFAULT_MODEL
        kinds = _arms(a, suite)
        opts = {**a.engine_opts, **opts}

        def for_kind(k: AttentionKind) -> dict[str, Any]:
            if not uses_indexer(k):
                return {x: v for x, v in opts.items() if x not in ("msa_overrides", "msa_telemetry")}
            # telemetry needs one process: a tensor-parallel engine runs without it
            tel = {"msa_telemetry": True} if a.telemetry and opts.get("tensor_parallel_size", 1) == 1 else {}
            if not (suite.msa_overrides or "msa_overrides" in opts):
                return {**tel, **opts}
            return {**tel, **opts, "msa_overrides": {**suite.msa_overrides, **opts.get("msa_overrides", {})}}

        return tuple(BackendSpec("local", model, attention=k, options=for_kind(k)) for k in kinds)
    if not a.base_url or not a.model:
        raise ConfigError("--backend openai needs --base-url URL and --model ID")
    return (BackendSpec("openai", a.model, base_url=a.base_url, options=opts),)


def _suite(a: RunArgs) -> SuiteConfig:
    suite = load_suite(a.suite)
    if a.tasks:
        names = tuple(t.strip() for t in a.tasks.split(",") if t.strip())
        by_name = {t.name: t for t in suite.tasks}
        suite = replace(suite, tasks=tuple(by_name.get(n, TaskEntry(n)) for n in names))
    if a.samples is not None:
        if a.samples < 1:
            raise ConfigError("--samples must be >= 1")
        suite = replace(suite, samples=a.samples, tasks=tuple(replace(t, samples=None) for t in suite.tasks))
    if a.lengths:  # --lengths applies to every task
        suite = replace(suite, lengths=parse_lengths(a.lengths),
                        tasks=tuple(replace(t, lengths=()) for t in suite.tasks))
    if a.mode:
        suite = replace(suite, mode=a.mode)
    if a.seed is not None:
        suite = replace(suite, seed=a.seed)
    return suite


def _local_concurrency(a: RunArgs) -> int:
    from msa_eval.backends.local import batching

    device = {**a.engine_opts, **parse_backend_opts(tuple(a.backend_opts))}.get("device")
    return batching(str(device) if device else None).concurrency


def prepare(a: RunArgs) -> Prepared:
    conc = a.concurrency if a.concurrency is not None else (_local_concurrency(a) if a.backend == "local" else 8)
    if conc < 1:  # 0 is no request per batch, never "the default"; checked before anything loads
        raise ConfigError(f"--concurrency must be >= 1, got {conc}")
    if a.out is not None:
        check_run_dir(a.out)
    suite = _suite(a)
    validate_tasks(suite)  # unknown task names fail before any model file is touched
    backends = _backends(a, suite)
    ref_model = a.reference or (backends[0].model if a.backend == "local" else DEFAULT_MODEL)
    tok, info = load_reference_tokenizer(ref_model)
    max_ctx = info["max_context"] if a.backend == "local" else None
    if a.backend == "local" and a.reference:  # the local model's own context bounds the lengths
        max_ctx = load_reference_tokenizer(backends[0].model)[1]["max_context"]
    lengths = suite.lengths or default_lengths(info["max_context"])
    check_lengths(tuple(sorted({*lengths, *(n for t in suite.tasks for n in t.lengths)})), max_ctx)
    suite = replace(suite, lengths=lengths)
    cfg = RunConfig(suite, backends, reference_model=f"{info['model_id']}:{info['fingerprint'][:16]}",
                    concurrency=conc)
    plan = build_plan(suite, lengths, tok, limit=a.limit)
    run_dir = a.out or Path("runs") / f"{Path(suite.name).stem}-{a.backend}-{cfg.config_hash()}"
    return Prepared(_default_cache_dir(cfg, run_dir), plan, run_dir, info, tok)


def _default_cache_dir(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """openai backends without `--backend-opt cache_dir=...` cache responses in `<run dir>/cache`,
    so a rerun replays them (reproducible, resumable). cache_dir is not part of the config hash."""
    backends = tuple(replace(b, options={**b.options, "cache_dir": str(run_dir / "cache")})
                     if b.kind == "openai" and "cache_dir" not in b.options else b for b in cfg.backends)
    return replace(cfg, backends=backends)
