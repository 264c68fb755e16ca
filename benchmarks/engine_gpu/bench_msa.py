"""MSA against dense attention on our engine, M3-attention shape (random weights): prefill time to
first token at long contexts, and decode throughput (CUDA graphs) at batch 8/32/64 with 32K / 128K
contexts, with the peak GPU memory of each.

    python3 benchmarks/engine_gpu/bench_msa.py --out $OUT --prefill 32768,131072,524288 --msa-only 1048576
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from benchmarks.engine_gpu.common import run_sections, env_info, fake_prefill, random_prompt, stack_engine, timed_steps


def free() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def ttft(eng, n: int, seed: int) -> float:
    from engine.sampling import SamplingParams

    eng.add_request(f"p{n}-{seed}", random_prompt(n, eng.model.cfg.vocab_size, seed), SamplingParams(max_tokens=1))
    torch.cuda.synchronize()
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def prefill(rows: list[dict], lengths: list[int], msa_only: list[int], layers: int, chunk: int,
            dense_chunk: int | None = None) -> None:
    """TTFT of one request per length. `chunk` is the MSA prefill chunk (its indexer's score buffer
    limits it to 512K on an H200); `dense_chunk` the dense one (default `chunk`): a whole prompt in one
    chunk takes SDPA's flash kernel, later chunks the memory-efficient one with a bottom-right mask."""
    for kind in ("msa", "dense"):
        todo = lengths + (msa_only if kind == "msa" else [])
        top = max(todo)
        kind_chunk = chunk if kind == "msa" else (dense_chunk or chunk)
        free()
        eng, model = stack_engine("m3-attn", kind, kv_tokens=top + 8192, layers=layers, max_num_seqs=1,
                                  max_batched=kind_chunk, max_model_len=top + 4096)
        ttft(eng, 4096, 0)  # warm-up: compiles the kernels
        for n in todo:
            torch.cuda.reset_peak_memory_stats()
            t = ttft(eng, n, 1)
            rows.append({"bench": "prefill", "attention": kind, "layers": layers, "ctx": n,
                         "chunk": min(kind_chunk, n),
                         "ttft_s": t, "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
            print(rows[-1], flush=True)
        del eng, model  # the next stack's peak must not count this one's weights


def decode(rows: list[dict], batches: list[int], contexts: list[int], layers: int, steps: int) -> None:
    for ctx in contexts:
        for batch in batches:
            for kind in ("msa", "dense"):
                free()
                eng, model = stack_engine("m3-attn", kind, kv_tokens=batch * (ctx + 2 * steps + 256), layers=layers,
                                      max_num_seqs=batch, max_model_len=ctx + 2 * steps + 128)
                fake_prefill(eng, batch, ctx, max_tokens=steps + 8)
                t = statistics.median(timed_steps(eng, steps))
                rows.append({"bench": "decode", "attention": kind, "layers": layers, "ctx": ctx, "batch": batch,
                             "step_ms": t * 1e3, "tok_s": batch / t,
                             "cache_gib": eng.cache.bytes() / 2**30,
                             "peak_gib": torch.cuda.max_memory_allocated() / 2**30})
                print(rows[-1], flush=True)
                del eng, model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill", default="32768,131072,524288")
    ap.add_argument("--msa-only", default="1048576")
    ap.add_argument("--prefill-layers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=524288, help="MSA prefill chunk (tokens)")
    ap.add_argument("--dense-chunk", type=int, default=None, help="dense prefill chunk (default: --chunk)")
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--decode-layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--skip", default="")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    rows: list[dict] = [{"bench": "env", **env_info()}]
    sections = {
        "decode": lambda: decode(rows, ints(args.batches), ints(args.contexts), args.decode_layers, args.steps),
        "prefill": lambda: prefill(rows, ints(args.prefill), ints(args.msa_only), args.prefill_layers, args.chunk,
                                   args.dense_chunk),
    }
    run_sections(sections, args.skip, rows, f"{args.out}/msa{args.tag}.json")


if __name__ == "__main__":
    main()
