"""MSA prefill on one GPU: fused indexer (scores, block max, top-k) + sparse attention against cuDNN dense
causal attention, through the public APIs (``msa_indexer``; ``plan_prefill`` and ``launch`` for the
attention, the op minus its input checks).

Method (as the RESULTS rows were measured): one request, causal prefill without prefix, paged caches
behind a shuffled page table, bf16; index inputs *structured* (tokens in topic segments of 256-4096
tokens drawn from 64 recurring topics, plus per-token noise) so that neighbours select overlapping
blocks as real text does; selections from the real fused indexer; the attention includes the
regrouping, union build and rare pass. Timing: median of CUDA-event-timed runs after one warm-up run,
a 256 MiB L2 flush before every run. Dense attention at 1M is ONE cold run (no warm-up: ~35 s).
FLOPs (MSA's conventions): indexer ``2 * d_idx * H_idx * T(T+1)/2``; sparse attention ``4 * d * G *
(visible selected keys)`` summed over (token, KV head), i.e. useful work only; dense ``4 * d * Hq * T(T+1)/2``.
On the CPU (``TRITON_INTERPRET=1``) the ``ci`` preset runs the same code on tiny shapes, one timed run each.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from kernels._common.device import device_info
from kernels.indexer import msa_indexer
from kernels.sparse_prefill import PrefillShape, plan_prefill
from kernels.sparse_prefill.launch import launch


@dataclass(frozen=True)
class Shape:
    hq: int
    hkv: int
    d: int
    block: int
    topk: int
    d_idx: int


SHAPES = {
    "m3": Shape(hq=64, hkv=4, d=128, block=128, topk=16, d_idx=128),  # MiniMax M3's attention
    "tiny": Shape(hq=16, hkv=1, d=64, block=64, topk=4, d_idx=64),  # the M3 group (16 heads) at interpreter size
}


@dataclass(frozen=True)
class Preset:
    doc: str
    cases: tuple[tuple[str, int], ...]  # (shape, tokens)
    dense_cold_from: int = 1 << 20  # from this many tokens cuDNN dense gets one cold run


PRESETS = {
    "headline": Preset("the README's prefill rows: M3 at 128K and 1M", (("m3", 131072), ("m3", 1 << 20))),
    "m3": Preset("M3 at 32K, 64K, 128K, 256K and 1M",
                 tuple(("m3", t) for t in (32768, 65536, 131072, 262144, 1 << 20))),
    "ci": Preset("tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)",
                 (("tiny", 64), ("tiny", 128))),
}
_FLUSH: torch.Tensor | None = None


def timed(fn, reps: int, cuda: bool) -> float:
    """Median milliseconds of ``reps`` runs after one warm-up run, the L2 flushed before each (on the CPU:
    one run, nothing to warm up in the interpreter)."""
    global _FLUSH
    if not cuda:
        return cold(fn, cuda)
    fn()
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        _FLUSH.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def reps_for(est_ms: float) -> int:
    """3..15 runs, about 1.5 s of them."""
    return int(max(3, min(15, 1500 / max(est_ms, 1e-3))))


def cold(fn, cuda: bool) -> float:
    """Milliseconds of one run with no warm-up (host clock, synchronised)."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def make_inputs(t: int, s: Shape, dev: str, seed: int = 0) -> dict:
    """One request of ``t`` tokens: q, paged K / V and index-K caches behind a shuffled page table, and
    structured index queries (recurring topics, so neighbours select overlapping blocks)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    n_pages = -(-t // s.block)
    perm = torch.randperm(n_pages, device=dev, generator=g).to(torch.int32)[None]
    seg_len = torch.randint(256, 4096, (t // 256 + 1,), device=dev, generator=g)
    seg_of_tok = torch.repeat_interleave(torch.arange(seg_len.numel(), device=dev), seg_len)[:t]
    topic_of_seg = torch.randint(0, 64, (seg_len.numel(),), device=dev, generator=g)
    topics = torch.randn(64, s.d_idx, device=dev, generator=g)
    base = topics[topic_of_seg[seg_of_tok]]
    k_idx = base + 0.7 * torch.randn(t, s.d_idx, device=dev, generator=g)
    head_mix = torch.randn(s.hkv, s.d_idx, s.d_idx, device=dev, generator=g) * 0.2 + torch.eye(s.d_idx, device=dev)
    q_idx = (torch.einsum("td,hde->the", base, head_mix)
             + 0.7 * torch.randn(t, s.hkv, s.d_idx, device=dev, generator=g))
    del base
    k_idx_cache = torch.zeros(n_pages * s.block, s.d_idx, device=dev, dtype=torch.bfloat16)
    k_idx_cache[:t] = k_idx.to(torch.bfloat16)
    k_idx_cache = k_idx_cache.view(n_pages, s.block, s.d_idx)[torch.argsort(perm[0])].contiguous()
    kc = torch.randn(n_pages, s.hkv, s.block, s.d, device=dev, generator=g, dtype=torch.bfloat16)
    vc = torch.randn(n_pages, s.hkv, s.block, s.d, device=dev, generator=g, dtype=torch.bfloat16)
    q = torch.randn(t, s.hq, s.d, device=dev, generator=g, dtype=torch.bfloat16)
    return dict(q=q, q_idx=q_idx.to(torch.bfloat16).contiguous(), k_idx_cache=k_idx_cache, k_cache=kc, v_cache=vc,
                page_table=perm.contiguous(), cu_seqlens_q=torch.tensor([0, t], dtype=torch.int32, device=dev),
                seq_lens_kv=torch.tensor([t], dtype=torch.int32, device=dev))


def useful_attention_flops(ids: torch.Tensor, t: int, s: Shape) -> float:
    """``4 d G`` per visible selected key: every selected block whole but the own one (the last valid slot)."""
    pos = torch.arange(t, device=ids.device)
    n_valid = (ids >= 0).sum(-1).double()  # [T, Hkv]
    keys = (n_valid - 1) * s.block + (pos % s.block + 1).double()[:, None]
    return 4.0 * s.d * (s.hq // s.hkv) * keys.sum().item()


def _tflops(flops: float, ms: float) -> float:
    return round(flops / ms / 1e9, 1)


def _label(t: int) -> str:
    if t >= 1 << 20 and t % (1 << 20) == 0:
        return f"{t >> 20}M"
    return f"{t // 1024}K" if t >= 1024 else str(t)


def case_row(name: str, t: int, dense_cold_from: int) -> dict:
    """One table row: indexer, attention, their total, cuDNN dense causal and the speed-up."""
    s = SHAPES[name]
    cuda = torch.cuda.is_available()
    x = make_inputs(t, s, "cuda" if cuda else "cpu")
    idx_args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    causal = t * (t + 1) / 2
    reps = reps_for(512 * s.d_idx / 128 * s.hkv / 4 * t * t / 500e12 * 1e3)
    t_idx = timed(lambda: msa_indexer(*idx_args, s.topk), reps, cuda)
    ids = msa_indexer(*idx_args, s.topk)
    t_att, plan = attention_ms(x, ids, reps, cuda)
    t_dense, one_cold = dense_ms(x, s, t >= dense_cold_from, cuda)
    dense_flops = 4 * s.d * s.hq * causal
    return dict(case=f"{name} {_label(t)}",
                kernels=f"{plan.kernel} tile + {plan.rare_pass} rare pass (rare_max {plan.rare_max})",
                indexer_ms=round(t_idx, 3), indexer_tflops=_tflops(2 * s.d_idx * s.hkv * causal, t_idx),
                attention_ms=round(t_att, 3), attention_tflops_useful=_tflops(useful_attention_flops(ids, t, s), t_att),
                msa_total_ms=round(t_idx + t_att, 3), dense_ms=round(t_dense, 3),
                dense_tflops=_tflops(dense_flops, t_dense), speedup=f"{t_dense / (t_idx + t_att):.2f}x",
                note="dense: one cold run" if one_cold else "")


def attention_ms(x: dict, ids: torch.Tensor, reps: int, cuda: bool):
    """The tile design's plan for this device and its timed launch (the op minus its input checks)."""
    q = x["q"]
    args = (q, x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    plan = plan_prefill(PrefillShape.of(q, x["k_cache"], x["v_cache"], x["page_table"], ids), device_info(q.device),
                        design="tile")
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device=q.device)
    scale = 1 / math.sqrt(q.shape[-1])
    return timed(lambda: launch(plan, *args, ids, out, lse, scale), reps, cuda), plan


def dense_ms(x: dict, s: Shape, one_cold: bool, cuda: bool) -> tuple[float, bool]:
    """cuDNN dense causal attention over the same q / K / V (the math backend on the CPU): timed, or one
    cold run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t = x["q"].shape[0]
    group = s.hq // s.hkv
    pt = x["page_table"][0].long()
    q = x["q"].transpose(0, 1)[None].contiguous()
    k = x["k_cache"][pt].permute(1, 0, 2, 3).reshape(s.hkv, -1, s.d)[:, :t].repeat_interleave(group, 0)[None]
    v = x["v_cache"][pt].permute(1, 0, 2, 3).reshape(s.hkv, -1, s.d)[:, :t].repeat_interleave(group, 0)[None]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION if cuda else SDPBackend.MATH]):
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731 - a one-line local helper
        if one_cold:
            return cold(fn, cuda), True
        return timed(fn, reps_for(4 * s.d * s.hq * t * (t + 1) / 2 / 550e12 * 1e3), cuda), False


def run(preset: str) -> list[dict]:
    """The preset's rows, one per case (each printed as it is done)."""
    p = PRESETS[preset]
    rows = []
    for name, t in p.cases:
        rows.append(case_row(name, t, p.dense_cold_from))
        print(rows[-1], flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows
