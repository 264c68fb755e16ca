"""MSA against dense attention on our engine: prefill time to first token and decode throughput on the
M3-attention stack (random weights), with the peak GPU memory of each; and MSA decode through its
three GPU paths (eager `MSAAttention`, `GraphMSAAttention` without and with CUDA graphs)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.engine_gpu.stacks import (
    fake_prefill,
    free,
    peak_gib,
    random_prompt,
    stack_engine,
    sync,
    timed_steps,
)


def ttft(eng, n: int, seed: int) -> float:
    """Seconds from adding one `n`-token request (max_tokens 1) to its end, every prefill chunk included."""
    from engine.sampling import SamplingParams

    eng.add_request(f"p{n}-{seed}", random_prompt(n, eng.model.cfg.vocab_size, seed), SamplingParams(max_tokens=1))
    sync()
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    sync()
    return time.perf_counter() - t


@dataclass(frozen=True)
class Prefill:
    """TTFT of one request per length, one run each after a 4096-token warm-up (compiles the kernels).
    `chunk` is the MSA prefill chunk (its indexer's score buffers limit it to 512K on an H200);
    `dense_chunk` the dense one (default `chunk`): a whole prompt in one chunk takes SDPA's flash
    kernel, later chunks the memory-efficient one with a bottom-right mask."""

    lengths: tuple[int, ...] = (32768, 131072, 524288)
    msa_only: tuple[int, ...] = (1048576,)
    layers: int = 2
    chunk: int = 524288
    dense_chunk: int | None = None
    name = "prefill"

    def run(self, opts) -> list[dict]:
        rows = []
        for kind in ("msa", "dense"):
            todo = self.lengths + (self.msa_only if kind == "msa" else ())
            top = max(todo)
            kind_chunk = self.chunk if kind == "msa" else (self.dense_chunk or self.chunk)
            free()
            eng, model = stack_engine("m3-attn", kind, kv_tokens=top + 8192, layers=self.layers, max_num_seqs=1,
                                      max_batched=kind_chunk, max_model_len=top + 4096)
            ttft(eng, 4096, 0)  # warm-up: compiles the kernels
            for n in todo:
                torch.cuda.reset_peak_memory_stats()
                t = ttft(eng, n, 1)
                rows.append({"bench": "prefill", "attention": kind, "layers": self.layers, "ctx": n,
                             "chunk": min(kind_chunk, n), "ttft_s": t, "peak_gib": peak_gib()})
                print(rows[-1], flush=True)
            del eng, model  # the next stack's peak must not count this one's weights
        return rows


@dataclass(frozen=True)
class Decode:
    """Decode tokens/s, CUDA graphs, MSA then dense per (context, batch): contexts filled as if
    prefilled, median of `steps` engine steps after 2 warm-up steps; peak memory over building the
    stack, filling the cache and decoding."""

    batches: tuple[int, ...] = (8, 32, 64)
    contexts: tuple[int, ...] = (32768, 131072)
    layers: int = 4
    steps: int = 16
    name = "decode"

    def run(self, opts) -> list[dict]:
        rows = []
        for ctx in self.contexts:
            for batch in self.batches:
                for kind in ("msa", "dense"):
                    free()
                    eng, model = stack_engine("m3-attn", kind, kv_tokens=batch * (ctx + 2 * self.steps + 256),
                                              layers=self.layers, max_num_seqs=batch,
                                              max_model_len=ctx + 2 * self.steps + 128)
                    fake_prefill(eng, batch, ctx, max_tokens=self.steps + 8)
                    t = statistics.median(timed_steps(eng, self.steps))
                    rows.append({"bench": "decode", "attention": kind, "layers": self.layers, "ctx": ctx,
                                 "batch": batch, "step_ms": t * 1e3, "tok_s": batch / t,
                                 "cache_gib": eng.cache.bytes() / 2**30, "peak_gib": peak_gib()})
                    print(rows[-1], flush=True)
                    del eng, model
        return rows


GRAPH_MODES = ("msa-eager", "msa-plan", "msa-graphs", "dense-graphs")


def _graph_row(eng, model: str, layers: int, msa_layers: int, ctx: int, batch: int, mode: str, steps: int) -> dict:
    fake_prefill(eng, batch, ctx, max_tokens=steps + 8)
    t = statistics.median(timed_steps(eng, steps))
    row = {"bench": "msa_graphs", "model": model, "layers": layers, "msa_layers": msa_layers, "ctx": ctx,
           "batch": batch, "mode": mode, "graphs_captured": bool(eng.graph_runner and eng.graph_runner.graphs),
           "step_ms": t * 1e3, "tok_s": batch / t}
    print(row, flush=True)
    return row


@dataclass(frozen=True)
class MSAGraphs:
    """The same MSA decode steps through `msa-eager` (plain `MSAAttention`: per layer the indexer and
    the attention plan and check their metadata with a host sync), `msa-plan` (`GraphMSAAttention`,
    graphs off: one plan per step), `msa-graphs` (what `--attention msa` runs on a GPU) and
    `dense-graphs` for scale; on the default model with its shipped indexer and on the M3 stack
    (every layer MSA). Contexts filled as if prefilled; median of `steps` steps after 2 warm-up."""

    batches: tuple[int, ...] = (1, 8)
    ctx: int = 4096
    m3_cases: tuple[tuple[int, int], ...] = ((32768, 8), (131072, 32))  # (context, batch)
    m3_layers: int = 4
    steps: int = 32
    name = "msa_graphs"

    def run(self, opts) -> list[dict]:
        return (self._default_model(opts.msa_model) if self.batches else []) + self._m3_stack()

    def _default_model(self, model: str) -> list[dict]:
        """One LLM (msa: its cache and weights); one engine per mode over the same model and cache."""
        from engine import LLM
        from engine.attention import make_attention
        from engine.attention.msa import MSAAttention
        from engine.gpu.msa_graph import GraphMSAAttention
        from engine.llm_engine import LLMEngine
        from engine.scheduler import SchedulerConfig

        top, rows = max(self.batches), []
        llm = LLM(model, attention="msa", device="cuda", dtype="bfloat16", max_num_seqs=top,
                  kv_cache_tokens=top * (self.ctx + self.steps + 256), progress=False)
        a = llm.engine.attention
        if type(a) is not GraphMSAAttention:
            raise RuntimeError(f"LLM(attention='msa') on cuda built {type(a).__name__}, not GraphMSAAttention")
        for batch in self.batches:
            for mode in GRAPH_MODES:
                dense = make_attention("dense", llm.device, llm.config)
                if mode == "dense-graphs":
                    attn = dense
                elif mode == "msa-eager":
                    attn = MSAAttention(a.msa, a.proj, a.rope, a.num_layers, a.scale, dense, impl="triton")
                else:
                    attn = GraphMSAAttention(a.msa, a.proj, a.rope, a.num_layers, a.scale, dense)
                eng = LLMEngine(llm.model, llm.tokenizer, attn, llm.cache, SchedulerConfig(top, 8192),
                                llm.max_model_len, llm.device, cuda_graphs=mode.endswith("graphs"))
                rows.append(_graph_row(eng, "default", llm.config.num_layers, len(a.msa_layers), self.ctx, batch,
                                       mode, self.steps))
                del eng
        del llm
        free()
        return rows

    def _m3_stack(self) -> list[dict]:
        from engine.testing import random_model, shape_config

        rows = []
        for ctx, batch in self.m3_cases:
            model = random_model(shape_config("m3-attn", num_layers=self.m3_layers,
                                              max_position=ctx + 2 * self.steps + 128), "cuda")
            for mode in GRAPH_MODES:
                kind = {"msa-eager": "msa-eager", "dense-graphs": "dense"}.get(mode, "msa")
                free()
                eng, _ = stack_engine("m3-attn", kind, kv_tokens=batch * (ctx + 2 * self.steps + 256),
                                      layers=self.m3_layers, max_num_seqs=batch,
                                      max_model_len=ctx + 2 * self.steps + 128, cuda_graphs=mode.endswith("graphs"),
                                      model=model)
                rows.append(_graph_row(eng, "m3-attn", self.m3_layers, self.m3_layers, ctx, batch, mode, self.steps))
                del eng
            del model
            free()
        return rows
