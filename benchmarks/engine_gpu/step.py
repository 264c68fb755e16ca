"""Where one decode step's wall time goes: default model, bf16, CUDA graphs, per batch size and mode
(`sync`: the step waits for its tokens; `async`: one step late, `engine.gpu.async_decode`), random
prompts of `prompt` tokens, `new` new tokens:

* wall ms per decode step (median of the `step()` calls after the prefill step) and decode tokens/s,
  first without any instrumentation;
* GPU ms of one graph replay (CUDA events around 50 back-to-back replays of the captured graph);
* device ops per step (kernels, copies: torch.profiler over one eager run of the graph's forward), the
  sum of their device times and the costliest kernels;
* host ms per step in named functions (a second run with perf_counter wrappers; inclusive times:
  a wrapped function's time contains the wrapped functions it calls; waits for the GPU included
  where named).

To compare with an older engine, put `git archive <commit> engine | tar -x -C .prof_old` first on
PYTHONPATH and tag the rows with `--label before`: the functions an engine version lacks are skipped.
"""
from __future__ import annotations

import importlib
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch

from benchmarks.engine_gpu.stacks import random_prompt

# (module, attribute path) of the functions timed; the ones an engine version lacks are skipped
TIMED = [("engine.scheduler", "Scheduler.schedule"), ("engine.llm_engine", "follow_up_rows"),
         ("engine.llm_engine", "LLMEngine._graph_rows"), ("engine.llm_engine", "LLMEngine._forward_logits"),
         ("engine.llm_engine", "LLMEngine._launch"), ("engine.gpu.graph_runner", "DecodeGraphRunner._stage"),
         ("engine.gpu.step_buffers", "StepBuffers.write"), ("engine.gpu.step_buffers", "StepBuffers.stage"),
         ("engine.gpu.graph_runner", "DecodeGraphRunner._plan_step"),
         ("engine.attention.dense", "DenseAttention.plan_decode"),
         ("engine.attention.dense", "GpuDenseAttention.plan_decode"), ("torch.cuda", "CUDAGraph.replay"),
         ("engine.gpu.sampler", "sample_batch"), ("engine.llm_engine", "LLMEngine._complete"),
         ("engine.gpu.graph_runner", "PendingTokens.result"), ("engine.llm_engine", "LLMEngine._append_token"),
         ("engine.llm_engine", "LLMEngine._check_stop")]


class Timers:
    """perf_counter wrappers around TIMED (installed by `install`, removed by `remove`)."""

    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list = []

    def install(self) -> None:
        for mod_name, path in TIMED:
            try:
                owner = importlib.import_module(mod_name)
                *parents, attr = path.split(".")
                for p in parents:
                    owner = getattr(owner, p)
                fn = getattr(owner, attr)
            except (ImportError, AttributeError):
                continue
            self._undo.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(path, fn))

    def _wrap(self, name: str, fn):
        total, calls = self.total, self.calls

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                total[name] += time.perf_counter() - t
                calls[name] += 1
        return timed

    def remove(self) -> None:
        for owner, attr, fn in reversed(self._undo):
            setattr(owner, attr, fn)
        self._undo.clear()


def decode_run(eng, batch: int, prompt: int, new: int, vocab: int) -> tuple[list[float], int]:
    """(wall seconds of each step() after the prefill step, decode tokens returned by those steps)."""
    from engine.sampling import SamplingParams

    for i in range(batch):
        eng.add_request(f"s{batch}-{i}-{time.time_ns()}", random_prompt(prompt, vocab, i),
                        SamplingParams(max_tokens=new, ignore_eos=True))
    eng.step()
    torch.cuda.synchronize()
    times, tokens = [], 0
    while eng.has_unfinished():
        t = time.perf_counter()
        tokens += sum(len(o.new_token_ids) for o in eng.step())
        times.append(time.perf_counter() - t)
    return times, tokens


def gpu_replay_ms(eng, batch: int, reps: int = 50) -> float:
    g = eng.graph_runner.graphs[eng.graph_runner.padded_size(batch)].graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def device_ops_per_step(eng, batch: int, top: int = 8) -> tuple[int, float, list[dict]]:
    """CUDA kernels and copies of one eager run of the captured forward (what the graph holds): their
    count, the sum of their device times (ms; the graph replay's excess over it is launch gaps) and
    the `top` kernel names by device time."""
    from torch.profiler import ProfilerActivity, profile

    r = eng.graph_runner
    bs = r.padded_size(batch)
    meta = r.graphs[bs].meta
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        r._forward(bs, meta)
        torch.cuda.synchronize()
    cuda = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in cuda) / 1e3
    by: dict[str, list[float]] = defaultdict(list)
    for e in cuda:
        by[e.name[:60]].append(e.device_time)
    kinds = sorted(({"kernel": k, "count": len(v), "ms": sum(v) / 1e3} for k, v in by.items()),
                   key=lambda d: -d["ms"])
    return len(cuda), busy, kinds[:top]


@dataclass(frozen=True)
class Step:
    """Decode step breakdown of the default model (module docstring)."""

    modes: tuple[str, ...] = ("sync", "async")
    batches: tuple[int, ...] = (1, 8)
    prompt: int = 512
    new: int = 64
    name = "step"

    def run(self, opts) -> list[dict]:
        from engine import LLM

        llm = LLM(opts.model, device="cuda", dtype="bfloat16", max_num_seqs=8, max_num_batched_tokens=8192,
                  kv_cache_tokens=65536, progress=False)
        eng, vocab, rows = llm.engine, llm.config.vocab_size, []
        for batch in self.batches:
            for mode in self.modes:
                eng.async_decode = mode == "async"
                rows.append(self._row(eng, batch, mode, vocab))
        return rows

    def _row(self, eng, batch: int, mode: str, vocab: int) -> dict:
        decode_run(eng, batch, self.prompt, 8, vocab)  # warm-up: graph capture
        times, tokens = decode_run(eng, batch, self.prompt, self.new, vocab)
        timers = Timers()
        timers.install()
        try:
            t_times, _ = decode_run(eng, batch, self.prompt, self.new, vocab)
        finally:
            timers.remove()
        steps = len(t_times)
        row = {"bench": "step", "mode": mode, "batch": batch,
               "step_ms": statistics.median(times) * 1e3, "tok_s": tokens / sum(times),
               "step_ms_instrumented": statistics.median(t_times) * 1e3,
               "gpu_replay_ms": gpu_replay_ms(eng, batch),
               "host_ms": {k: v * 1e3 / steps for k, v in sorted(timers.total.items())},
               "calls_per_step": {k: v / steps for k, v in sorted(timers.calls.items())}}
        row["device_ops"], row["device_busy_ms"], row["top_kernels"] = device_ops_per_step(eng, batch)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k not in
               ("host_ms", "calls_per_step", "top_kernels")}, flush=True)
        for k in row["top_kernels"]:
            print(f"    kernel {k['kernel']:60s} x{k['count']:4d} {k['ms']:.4f} ms", flush=True)
        for k, v in row["host_ms"].items():
            print(f"    {k:40s} {v:8.4f} ms/step  ({row['calls_per_step'][k]:.2f} calls)", flush=True)
        return row
