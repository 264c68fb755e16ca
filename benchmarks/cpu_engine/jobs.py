"""The timed jobs of our engine that `run.py` (against HF transformers) and `msa.py` (dense vs MSA) share: a job
runs once and returns the seconds to count, with the tokens it counts."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

Job = tuple[Callable[[], float], int]  # (run once, returning the seconds to count; tokens counted)


class Sizes(Protocol):
    """What a decode job reads of a preset."""

    context: int  # prompt tokens before decoding
    new_tokens: int


def prompt_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 40000, (n,), generator=g).tolist()


def timed(fn: Callable) -> Callable[[], float]:
    def job() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    return job


def our_job(llm, metric: str, p: Sizes) -> Job:
    from engine import SamplingParams

    if metric.startswith("prefill_"):
        n = int(metric.split("_")[1])
        ids = prompt_ids(n, n)
        return timed(lambda: llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))), n
    b = int(metric.split("_b")[1])
    batch = [prompt_ids(p.context, 100 + i) for i in range(b)]
    dec = SamplingParams(max_tokens=p.new_tokens, ignore_eos=True)

    def decode() -> float:
        eng = llm.engine
        ids = [f"bench-{time.perf_counter_ns()}-{i}" for i in range(b)]
        seqs = [eng.add_request(r, q, dec) for r, q in zip(ids, batch, strict=True)]
        while any(not s.output_ids for s in seqs):  # prefill steps, up to every request's first token
            eng.step()
        t = time.perf_counter()
        while eng.has_unfinished():
            eng.step()
        dt = time.perf_counter() - t
        for r in ids:
            eng.pop_finished(r)
        return dt
    return decode, b * (p.new_tokens - 1)
