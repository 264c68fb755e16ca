"""Dense vs MSA on the CPU engine (presets `msa-prefill`, `msa-decode` of `benchmarks.cpu_engine.run`).

Default model, ours only. Per weight mode, one `LLM` per arm (`dense`, `msa` at each top-k), loaded
together; every repeat runs every arm in turn at the same metric (interleaved, so load from other
processes hits all arms alike); each figure is the median of the repeats after one short warm-up per
arm. Prefill: the wall time of `LLM.generate(prompt, max_tokens=1)` on one whole prompt (chunked by the
engine's default 2048-token budget), reported as seconds and as the ratio to dense: wall seconds, or
with `clock="cpu"` (one thread) the process's CPU seconds, which other processes' load barely moves. Decode: tokens/s as
in `run.py` (b x (new - 1) over the time from the first sampled token to the last) after a
`context`-token prompt per request.
"""
from __future__ import annotations

import gc
import statistics
import time

import torch

Arm = tuple[str, int | None]  # (attention kind, MSA top-k; None for dense)


def arm_name(weights: str, arm: Arm) -> str:
    kind, k = arm
    return f"{weights} {kind}" + (f" k{k}" if k else "")


def load_arm(weights: str, arm: Arm, kv_tokens: int):
    from engine import LLM

    kind, k = arm
    return LLM("smollm2-135m", attention=kind, device="cpu", progress=False, weights=weights,
               kv_cache_tokens=kv_tokens, msa_overrides={"topk": k} if k else None)


def _warm(llm) -> None:
    from benchmarks.cpu_engine.jobs import prompt_ids
    from engine import SamplingParams

    llm.generate([prompt_ids(300, 1)], SamplingParams(max_tokens=2, ignore_eos=True))


def _prefill_seconds(llm, n: int, clock: str) -> float:
    from benchmarks.cpu_engine.jobs import prompt_ids
    from engine import SamplingParams

    ids = prompt_ids(n, n)
    t = time.perf_counter() if clock == "wall" else time.process_time()
    llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))
    return (time.perf_counter() if clock == "wall" else time.process_time()) - t


def _decode_tokens_per_s(llm, metric: str, p) -> float:
    from benchmarks.cpu_engine.jobs import our_job

    job, tokens = our_job(llm, metric, p)
    return tokens / job()


@torch.inference_mode()
def run(p) -> list[dict]:
    """One row per (weight mode, metric): seconds (prefill) or tokens/s (decode) per arm, and ratios to dense."""
    rows = []
    for weights in p.weights:
        kv_tokens = max(2 * 8192, max((int(m.split("_b")[1]) for m in p.metrics if m.startswith("decode_")),
                                      default=1) * (p.context + p.new_tokens) + 256)
        llms = {}
        for arm in p.arms:
            llms[arm_name(weights, arm)] = llm = load_arm(weights, arm, kv_tokens)
            _warm(llm)
        dense = arm_name(weights, ("dense", None))
        for metric in p.metrics:
            times: dict[str, list[float]] = {k: [] for k in llms}
            for _ in range(p.repeats):
                for name, llm in llms.items():
                    if metric.startswith("prefill_"):
                        times[name].append(_prefill_seconds(llm, int(metric.split("_")[1]), p.clock))
                    else:
                        times[name].append(_decode_tokens_per_s(llm, metric, p))
            res = {arm_name(weights, a).split(" ", 1)[1]: statistics.median(times[arm_name(weights, a)])
                   for a in p.arms}
            row = {"bench": "cpu_engine_msa", "weights": weights, "metric": metric, **res}
            base = res[dense.split(" ", 1)[1]]
            row.update({f"{a} / dense": v / base for a, v in res.items() if a != "dense"})
            rows.append(row)
            print(weights, metric, {k: round(v, 2) for k, v in res.items()}, flush=True)
        del llms
        gc.collect()
    return rows


def markdown(rows: list[dict], p) -> str:
    from benchmarks.cli import table

    arms = [arm_name("", a).strip() for a in p.arms]
    unit = "s" if p.metrics[0].startswith("prefill_") else "tokens/s"
    return table([r for r in rows if r["bench"] == "cpu_engine_msa"],
                 [("weights", "weights", "{}"), (f"metric ({unit})", "metric", "{}")]
                 + [(a, a, "{:.2f}") for a in arms] + [(f"{a} / dense", f"{a} / dense", "{:.2f}x")
                                                        for a in arms if a != "dense"])
