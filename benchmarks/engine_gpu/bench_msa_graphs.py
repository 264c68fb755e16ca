"""MSA decode on a GPU before and after `GraphMSAAttention` was wired into `--attention msa`:
tokens/s of the same decode steps through

* `msa-eager`: plain `MSAAttention` (what `--attention msa` built on a GPU before: per layer, the
  indexer and the sparse attention each plan their kernels and check the metadata with a host sync),
* `msa-plan`: `GraphMSAAttention` with CUDA graphs off (one plan per step, kernels launched eagerly),
* `msa-graphs`: `GraphMSAAttention` replayed from CUDA graphs (what `--attention msa` gets now),
* `dense-graphs`: dense attention from CUDA graphs, for scale,

on the default model (SmolLM2-135M with its shipped adapter, bf16) and the M3-attention random stack
(4 layers, every layer MSA). Contexts are filled as if prefilled (`common.fake_prefill`).

    python3 benchmarks/engine_gpu/bench_msa_graphs.py --out $OUT
"""
from __future__ import annotations

import argparse
import gc
import statistics

import torch

from benchmarks.engine_gpu.common import run_sections, env_info, fake_prefill, stack_engine, timed_steps

MODES = ("msa-eager", "msa-plan", "msa-graphs", "dense-graphs")


def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _time(eng, batch: int, ctx: int, steps: int) -> float:
    fake_prefill(eng, batch, ctx, max_tokens=steps + 8)
    return statistics.median(timed_steps(eng, steps))


def default_model(rows: list[dict], batches: list[int], ctx: int, steps: int) -> None:
    """One LLM (msa, its cache and weights); one engine per mode over the same model and cache."""
    from engine import LLM
    from engine.attention.dense import DenseAttention
    from engine.attention.msa import MSAAttention
    from engine.gpu.msa_graph import GraphMSAAttention
    from engine.llm_engine import LLMEngine
    from engine.scheduler import SchedulerConfig

    top = max(batches)
    llm = LLM("smollm2-135m", attention="msa", device="cuda", dtype="bfloat16", max_num_seqs=top,
              kv_cache_tokens=top * (ctx + steps + 256), progress=False)
    a = llm.engine.attention
    if type(a) is not GraphMSAAttention:
        raise RuntimeError(f"LLM(attention='msa') on cuda built {type(a).__name__}, not GraphMSAAttention")
    for batch in batches:
        for mode in MODES:
            if mode == "dense-graphs":
                attn = DenseAttention(a.scale)
            else:
                attn = (MSAAttention if mode == "msa-eager" else GraphMSAAttention)(
                    a.msa, a.proj, a.rope, a.num_layers, a.scale)
            eng = LLMEngine(llm.model, llm.tokenizer, attn, llm.cache, SchedulerConfig(top, 8192), llm.max_model_len,
                            llm.device, cuda_graphs=mode.endswith("graphs"))
            t = _time(eng, batch, ctx, steps)
            rows.append({"bench": "msa_graphs", "model": "default", "layers": llm.config.num_layers,
                         "msa_layers": len(a.msa_layers), "ctx": ctx, "batch": batch, "mode": mode,
                         "graphs_captured": bool(eng.graph_runner and eng.graph_runner.graphs),
                         "step_ms": t * 1e3, "tok_s": batch / t})
            print(rows[-1], flush=True)
            del eng
    del llm
    _free()


def m3_stack(rows: list[dict], cases: list[tuple[int, int]], layers: int, steps: int) -> None:
    from engine.random_model import random_model, shape_config

    for ctx, batch in cases:
        model = random_model(shape_config("m3-attn", num_layers=layers, max_position=ctx + 2 * steps + 128), "cuda")
        for mode in MODES:
            kind = {"msa-eager": "msa-eager", "dense-graphs": "dense"}.get(mode, "msa")
            _free()
            eng, _ = stack_engine("m3-attn", kind, kv_tokens=batch * (ctx + 2 * steps + 256), layers=layers,
                                  max_num_seqs=batch, max_model_len=ctx + 2 * steps + 128,
                                  cuda_graphs=mode.endswith("graphs"), model=model)
            t = _time(eng, batch, ctx, steps)
            rows.append({"bench": "msa_graphs", "model": "m3-attn", "layers": layers, "msa_layers": layers,
                         "ctx": ctx, "batch": batch, "mode": mode,
                         "graphs_captured": bool(eng.graph_runner and eng.graph_runner.graphs),
                         "step_ms": t * 1e3, "tok_s": batch / t})
            print(rows[-1], flush=True)
            del eng
        del model
        _free()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8", help="default model batch sizes")
    ap.add_argument("--ctx", type=int, default=4096, help="default model context")
    ap.add_argument("--m3", default="32768x8,131072x32", help="M3 stack cases, CONTEXTxBATCH")
    ap.add_argument("--m3-layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--skip", default="", help="comma list of sections to skip: default, m3")
    args = ap.parse_args()
    rows: list[dict] = [{"bench": "env", **env_info()}]
    cases = [tuple(int(x) for x in c.split("x")) for c in args.m3.split(",") if c]
    sections = {"default": lambda: default_model(rows, [int(b) for b in args.batches.split(",")], args.ctx,
                                                 args.steps),
                "m3": lambda: m3_stack(rows, cases, args.m3_layers, args.steps)}
    run_sections(sections, args.skip, rows, f"{args.out}/msa_graphs.json")


if __name__ == "__main__":
    main()
