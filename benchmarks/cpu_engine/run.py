"""CPU speed of our engine against HF transformers, same machine, same process, interleaved.

    OMP_NUM_THREADS=1 python -m benchmarks.cpu_engine.run --preset decode [--json OUT]
    OMP_NUM_THREADS=2 python -m benchmarks.cpu_engine.run --preset msa-prefill   # dense vs MSA (msa.py)

Default model. Prefill tokens/s at 512 and 4096 prompt tokens; decode tokens/s at batch 1 and
aggregate at batch 8 (after a `context`-token prompt, greedy, EOS ignored). Engines: ours in each
weight mode (fp32 = the exact dequantized weights, bf16, q4 = the GGUF's own 4-bit codes;
`engine.cpu_weights`) and HF transformers in each dtype (it dequantizes the GGUF to that dtype), all
loaded once. Every repeat runs every engine in turn (interleaved, so load from other processes on a
shared machine hits all of them alike); each figure is the median of `repeats` timed runs after one
warm-up. Decode tokens/s = b x (new - 1) / the time from the first sampled token to the last (ours:
engine steps after the prefill steps; HF: a logits processor stamps its first call, which follows the
prefill forward). HF runs `generate` with its default dynamic cache. Set OMP_NUM_THREADS to the
preset's threads (OpenMP reads it before torch starts).
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.cli import env_row, parser, run_sections, table
from benchmarks.cpu_engine.jobs import Job, our_job, prompt_ids, timed


@dataclass(frozen=True)
class Preset:
    doc: str
    metrics: tuple[str, ...]  # prefill_N (N prompt tokens) | decode_bB (batch B)
    weights: tuple[str, ...] = ("fp32", "bf16", "q4")
    hf_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    repeats: int = 3
    threads: int = 1
    context: int = 128  # prompt tokens before decoding
    new_tokens: int = 32
    arms: tuple[tuple[str, int | None], ...] = ()  # (attention, MSA top-k): ours only, dense vs MSA (msa.py)
    clock: str = "wall"  # msa prefill: "wall" seconds or the process's "cpu" seconds (one thread: load-proof)


MSA_ARMS = (("dense", None), ("msa", 4), ("msa", 16))


PRESETS: dict[str, Preset] = {
    "decode": Preset("the README's decode rows: batch 1 and 8, 1 thread, median of 5", ("decode_b1", "decode_b8"),
                     repeats=5),
    "decode-2t": Preset("decode at batch 1 and 8 with 2 threads (needs a quiet machine), median of 3",
                        ("decode_b1", "decode_b8"), threads=2),
    "prefill": Preset("prefill at 512 and 4096 tokens, 1 thread, median of 3", ("prefill_512", "prefill_4096")),
    "full": Preset("prefill and decode, 1 thread, median of 3",
                   ("prefill_512", "prefill_4096", "decode_b1", "decode_b8")),
    "msa-prefill": Preset("whole-prompt prefill at 2K, 4K and 8K, dense vs msa top-k 4 and 16, fp32 and q4, 2 threads, "
                          "one timed run (seconds)", ("prefill_2048", "prefill_4096", "prefill_8191"),
                          weights=("fp32", "q4"), hf_dtypes=(), repeats=1, threads=2, arms=MSA_ARMS),
    "msa-prefill-cpu": Preset("msa-prefill in CPU seconds of one thread (robust to a shared machine's load), fp32",
                              ("prefill_2048", "prefill_4096", "prefill_8191"), weights=("fp32",), hf_dtypes=(),
                              repeats=1, arms=MSA_ARMS, clock="cpu"),
    "msa-decode": Preset("decode at batch 1 and 8 after a 4K prompt, dense vs msa top-k 4 and 16, fp32 and q4, "
                         "2 threads, one timed run", ("decode_b1", "decode_b8"), weights=("fp32", "q4"), hf_dtypes=(),
                         repeats=1, threads=2, context=4096, new_tokens=16, arms=MSA_ARMS),
    "ci": Preset("tiny: ours fp32 and q4 vs HF fp32, batch 1 and 2, 4 new tokens (seconds)",
                 ("prefill_64", "decode_b1", "decode_b2"), weights=("fp32", "q4"), hf_dtypes=("float32",),
                 repeats=1, context=16, new_tokens=4),
}


def hf_job(model, metric: str, p: Preset) -> Job:
    from transformers import LogitsProcessor, LogitsProcessorList

    if metric.startswith("prefill_"):
        n = int(metric.split("_")[1])
        x = torch.tensor([prompt_ids(n, n)])
        return timed(lambda: model(x, use_cache=False)), n
    b = int(metric.split("_b")[1])
    x = torch.tensor([prompt_ids(p.context, 100 + i) for i in range(b)])

    class FirstCall(LogitsProcessor):
        t: float | None = None

        def __call__(self, input_ids, scores):
            if self.t is None:
                self.t = time.perf_counter()
            return scores

    def decode() -> float:
        stamp = FirstCall()
        model.generate(x, max_new_tokens=p.new_tokens, min_new_tokens=p.new_tokens, do_sample=False,
                       pad_token_id=0, logits_processor=LogitsProcessorList([stamp]))
        return time.perf_counter() - stamp.t
    return decode, b * (p.new_tokens - 1)


@torch.inference_mode()
def measure(jobs: dict[str, Job], repeats: int) -> dict[str, float]:
    """tokens/s per engine; repeats interleaved across engines, after one warm-up of each."""
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for job, _ in jobs.values():
        job()
    for _ in range(repeats):
        for name, (job, _) in jobs.items():
            times[name].append(job())
    return {name: n / statistics.median(times[name]) for name, (_, n) in jobs.items()}


def load_engines(p: Preset) -> dict[str, tuple[object, Callable[..., Job]]]:
    from transformers import AutoModelForCausalLM

    from engine import LLM

    engines: dict[str, tuple[object, Callable[..., Job]]] = {}
    for m in p.weights:
        engines[f"ours {m}"] = (LLM("smollm2-135m", device="cpu", progress=False, weights=m, kv_cache_tokens=8192),
                                our_job)
    path = engines[f"ours {p.weights[0]}"][0].model_path
    for d in p.hf_dtypes:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=getattr(torch, d)).eval()
        engines[f"HF {d}"] = (model, hf_job)
    return engines


def ratio_columns(p: Preset) -> list[tuple[str, str]]:
    """Every mode vs HF's first dtype (float32: the baseline); reduced-precision modes also vs HF's others."""
    return [(f"ours {m}", f"HF {p.hf_dtypes[0]}") for m in p.weights] + [
        (f"ours {m}", f"HF {d}") for m in p.weights if m != "fp32" for d in p.hf_dtypes[1:]]


def run(p: Preset) -> list[dict]:
    """One row per metric: tokens/s per engine (key = engine name) and the ratios (key 'A / B')."""
    engines = load_engines(p)
    rows = []
    for metric in p.metrics:
        res = measure({k: fn(e, metric, p) for k, (e, fn) in engines.items()}, p.repeats)
        row = {"bench": "cpu_engine", "metric": metric, **res}
        row.update({f"{a} / {b}": res[a] / res[b] for a, b in ratio_columns(p)})
        rows.append(row)
        print(metric, {k: round(v, 1) for k, v in res.items()}, flush=True)
    return rows


def markdown(rows: list[dict], p: Preset) -> str:
    engines = [f"ours {m}" for m in p.weights] + [f"HF {d}" for d in p.hf_dtypes]
    ratios = [f"{a} / {b}" for a, b in ratio_columns(p)]
    return table([r for r in rows if r["bench"] == "cpu_engine"],
                 [("metric (tokens/s)", "metric", "{}")] + [(e, e, "{:.1f}") for e in engines]
                 + [(r, r, "{:.2f}x") for r in ratios])


def main(argv: list[str] | None = None) -> None:
    args = parser("python -m benchmarks.cpu_engine.run", __doc__, PRESETS).parse_args(argv)
    p = PRESETS[args.preset]
    torch.set_num_threads(p.threads)
    rows: list[dict] = [env_row(args.preset, ("transformers",), threads=p.threads, repeats=p.repeats,
                                context=p.context, new_tokens=p.new_tokens)]
    from benchmarks.cpu_engine import msa

    run_p, markdown_p = (msa.run, msa.markdown) if p.arms else (run, markdown)
    run_sections([("cpu_engine", lambda: run_p(p) + [{"bench": "end", "loadavg_1m": os.getloadavg()[0]}])],
                 rows, args.json)
    print(markdown_p(rows, p))
    print(f"load average {rows[0]['loadavg_1m']:.2f} at start, {rows[-1].get('loadavg_1m', 0):.2f} at end; "
          f"{p.threads} torch thread(s)")


if __name__ == "__main__":
    main()
