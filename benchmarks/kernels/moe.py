"""The MiniMax-M3 MoE on one GPU through the public ops: ``moe_route`` (fused router) and ``moe_experts``
(expert-sorted grouped GEMMs, SwiGLU-OAI and the routing weight fused), against torch baselines: a loop
over the chosen experts of ``F.linear`` pairs, and ``torch._grouped_mm`` where this torch has it.

Method: random bf16 weights for all E experts (N(0, 1) / sqrt(fan-in)), random N(0, 1) tokens routed by
a random router with a correction bias (real top-k choices, about uniform over experts). Decode sizes
(T <= 256): median of 10 replays of one CUDA graph holding the whole ``moe_experts`` call (alignment
included); the chosen experts' weights exceed the L2 at every T, so the cache never holds them. Larger
T: median of CUDA-event-timed runs after a warm-up, the L2 flushed before each (``prefill.timed``).
FLOPs: ``6 * T * k * H * I`` (gate_up 2 x 2I x H, down 2 x H x I per routed pair). Bytes: the chosen
experts' weights, ``distinct experts x 3 x I x H x 2``. Ceilings measured in the same call: bf16
``torch.mm`` of 8192^3 (FLOP/s) and an SM copy kernel over 2 GiB (``torch.mul(x, 1, out=y)``, read + write
bytes per second, as ``decode.py``); ``y.copy_(x)`` (a memcpy, about 2.7 TB/s) is printed beside it.
On the CPU (``TRITON_INTERPRET=1``) the ``ci`` preset runs the same code on tiny shapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.kernels.decode import graph_time
from benchmarks.kernels.prefill import reps_for, timed
from kernels.moe import GemmConfig, MoETuning, moe_experts, moe_route, plan_experts
from kernels.moe.reference import route_reference, swiglu_oai

GIB = 1 << 30
ALPHA, LIMIT, SCALING = 1.702, 7.0, 2.5


@dataclass(frozen=True)
class MoEShape:
    hidden: int
    inter: int
    experts: int
    topk: int


SHAPES = {"m3": MoEShape(6144, 3072, 128, 4), "tiny": MoEShape(64, 32, 8, 2)}


@dataclass(frozen=True)
class Preset:
    doc: str
    shape: str
    tokens: tuple[int, ...]
    variants: tuple[tuple[int, str, MoETuning], ...] = ()  # (T, label, tuning) timed beside the plan's own
    baselines: bool = True


def _cfg(bn: int, bk: int, warps: int, stages: int) -> GemmConfig:
    return GemmConfig(bn, bk, warps, stages)


_SWEEP = (  # run on the H200 once each; the plan keeps the fastest (RESULTS.md)
    (1, "bn32", MoETuning(gate_up=_cfg(32, 128, 4, 4), down=_cfg(32, 128, 4, 4))),
    (1, "bn32 bk256", MoETuning(gate_up=_cfg(32, 256, 4, 3), down=_cfg(32, 256, 4, 3))),
    (1, "bn16 bk256", MoETuning(gate_up=_cfg(16, 256, 4, 3), down=_cfg(16, 256, 4, 3))),
    (8, "bn32", MoETuning(gate_up=_cfg(32, 128, 4, 4), down=_cfg(32, 128, 4, 4))),
    (8, "bn32 bk256", MoETuning(gate_up=_cfg(32, 256, 4, 3), down=_cfg(32, 256, 4, 3))),
    (64, "bk256", MoETuning(gate_up=_cfg(64, 256, 4, 3), down=_cfg(64, 256, 4, 3))),
    (64, "bn32", MoETuning(gate_up=_cfg(32, 128, 4, 4), down=_cfg(32, 128, 4, 4))),
    (4096, "middle tiles (BM 64)", MoETuning(block_m=64, gate_up=_cfg(64, 64, 4, 3), down=_cfg(128, 64, 4, 3),
                                             group_m=4)),
    (4096, "BM 64, BN 128", MoETuning(block_m=64, gate_up=_cfg(128, 64, 4, 4), down=_cfg(128, 64, 4, 4),
                                      group_m=4)),
    (32768, "group 16", MoETuning(group_m=16)),
    (32768, "stages 4 (both)", MoETuning(gate_up=_cfg(128, 64, 8, 4), down=_cfg(256, 64, 8, 4))),
)

PRESETS = {
    "m3": Preset("M3 experts (H 6144, I 3072, E 128, k 4) at T = 1, 8, 64 (decode), 4K, 32K (prefill)", "m3",
                 (1, 8, 64, 4096, 32768)),
    "sweep": Preset("M3 at T = 1, 8, 64, 4K, 32K: the plan's tiles against a few others", "m3",
                    (1, 8, 64, 4096, 32768), variants=_SWEEP, baselines=False),
    "ci": Preset("tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)", "tiny", (5, 300),
                 variants=((5, "bn32", MoETuning(gate_up=_cfg(32, 32, 4, 2))),)),
}


def ceilings() -> tuple[float, float, float]:
    """Measured here: bf16 ``torch.mm`` FLOP/s on 8192^3; copy bytes/s (read + write) over 2 GiB of an SM
    kernel (``torch.mul(x, 1, out=y)``, the ceiling) and of ``y.copy_(x)`` (a device-to-device memcpy)."""
    n = 8192
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda",
                                                                             dtype=torch.bfloat16)
    t_mm = timed(lambda: torch.mm(a, b), 15, True) / 1e3
    x = torch.randn(GIB, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    t_sm = graph_time([lambda: torch.mul(x, 1.0, out=y)], cuda=True)
    t_memcpy = graph_time([lambda: y.copy_(x)], cuda=True)
    return 2 * n**3 / t_mm, 4 * GIB / t_sm, 4 * GIB / t_memcpy


def torch_loop(x, w13, w2, weights, ids):
    """Per chosen expert: F.linear, SwiGLU-OAI, F.linear, weight, index_add (host sync for the groups)."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        pairs = order[start:start + c]
        start += c
        tok = pairs // ids.shape[1]
        h = swiglu_oai(F.linear(x[tok], w13[e]), ALPHA, LIMIT)
        y = F.linear(h, w2[e]) * weights.reshape(-1)[pairs, None]
        out.index_add_(0, tok, y.float())
    return (out * SCALING).to(x.dtype)


def torch_grouped(x, w13, w2, weights, ids):
    """``torch._grouped_mm`` over the expert-sorted pairs (no padding), SwiGLU-OAI between, index_add."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=w13.shape[0]), 0).to(torch.int32)
    tok = order // ids.shape[1]
    h = swiglu_oai(torch._grouped_mm(x[tok], w13.transpose(1, 2), offs=offs), ALPHA, LIMIT)
    y = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs) * weights.reshape(-1)[order, None]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, y.float())
    return (out * SCALING).to(x.dtype)


class Weights:
    def __init__(self, s: MoEShape, dev: str, dtype: torch.dtype, seed: int = 0):
        g = torch.Generator(device=dev).manual_seed(seed)
        e, h, i = s.experts, s.hidden, s.inter
        self.w13 = torch.randn(e, 2 * i, h, generator=g, device=dev, dtype=dtype) / math.sqrt(h)
        self.w2 = torch.randn(e, h, i, generator=g, device=dev, dtype=dtype) / math.sqrt(i)
        self.router = torch.randn(e, h, generator=g, device=dev, dtype=dtype) / math.sqrt(h)
        self.bias = torch.randn(e, generator=g, device=dev) * 0.01


def case_rows(s: MoEShape, t: int, wts: Weights, preset: Preset, ceil: tuple[float, ...] | None) -> list[dict]:
    cuda = torch.cuda.is_available()
    dev = wts.w13.device
    x = torch.randn(t, s.hidden, device=dev, dtype=wts.w13.dtype)
    weights, ids = moe_route(x, wts.router, wts.bias, s.topk, impl="auto" if cuda else "triton")
    ref_w, ref_ids = route_reference(x, wts.router, wts.bias, s.topk)
    same_ids = (torch.sort(ids, -1).values == torch.sort(ref_ids, -1).values).all(-1).float().mean().item()
    distinct = int(torch.unique(ids).numel())
    flops = 6 * t * s.topk * s.hidden * s.inter
    nbytes = distinct * 3 * s.inter * s.hidden * wts.w13.element_size()
    decode = t <= 256
    args = (x, wts.w13, wts.w2, weights, ids)
    impl = "auto" if cuda else "triton"  # the CPU runs the kernels in the interpreter

    def time_of(fn) -> float:
        if decode and cuda:
            return graph_time([fn], cuda) * 1e3
        return timed(fn, reps_for(flops / 4e14 * 1e3), cuda)

    ref = torch_loop(*args)
    rows: list[dict] = []
    plan_ms = 0.0
    variants = [(label, tuning) for vt, label, tuning in preset.variants if vt == t]
    for label, tuning in [("plan", None), *variants]:
        plan = plan_experts(t, s.topk, s.experts, x.dtype, dev, impl=impl, tuning=tuning)
        try:
            out = moe_experts(*args, alpha=ALPHA, limit=LIMIT, scaling=SCALING, impl=impl, tuning=tuning)
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile here (shared memory) is a row
            rows.append(dict(tokens=t, variant=label, experts_ms=f"failed: {str(exc).splitlines()[0][:80]}"))
            continue
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        ms = time_of(lambda tuning=tuning: moe_experts(*args, alpha=ALPHA, limit=LIMIT, scaling=SCALING, impl=impl,
                                                       tuning=tuning))
        plan_ms = plan_ms or ms
        row = dict(tokens=t, variant=label if tuning else f"plan ({plan.regime}, BM {plan.block_m})",
                   experts_ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1), pct_mm_peak=None,
                   distinct_experts=distinct, expert_gb_per_s=round(nbytes / ms / 1e6, 1), pct_copy=None,
                   rel_err_vs_loop=f"{err:.1e}")
        if ceil:
            row.update(pct_mm_peak=f"{100 * flops / (ms / 1e3) / ceil[0]:.1f}%",
                       pct_copy=f"{100 * nbytes / (ms / 1e3) / ceil[1]:.1f}%")
        rows.append(row)
    route_ms = time_of(lambda: moe_route(x, wts.router, wts.bias, s.topk, impl=impl))
    rows[0].update(route_ms=round(route_ms, 4), route_ids_equal_ref=f"{same_ids:.3f}")
    if preset.baselines:
        t_loop = time_of(lambda: torch_loop(*args)) if not (decode and cuda) else timed(lambda: torch_loop(*args),
                                                                                        10, cuda)
        rows[0].update(torch_loop_ms=round(t_loop, 4), vs_loop=f"{t_loop / plan_ms:.2f}x")
        if cuda and hasattr(torch, "_grouped_mm"):
            try:
                err = ((torch_grouped(*args).float() - ref.float()).norm() / ref.float().norm()).item()
                t_gm = timed(lambda: torch_grouped(*args), reps_for(flops / 4e14 * 1e3), cuda)
                rows[0].update(grouped_mm_ms=round(t_gm, 4), vs_grouped_mm=f"{t_gm / plan_ms:.2f}x",
                               grouped_mm_err=f"{err:.1e}")
            except (RuntimeError, TypeError) as exc:
                rows[0].update(grouped_mm_ms=f"n/a ({str(exc).splitlines()[0][:60]})")
    return rows


def run(preset: str) -> list[dict]:
    p = PRESETS[preset]
    s = SHAPES[p.shape]
    cuda = torch.cuda.is_available()
    ceil = None
    if cuda:
        ceil = ceilings()
        print(dict(mm_peak_tflops=round(ceil[0] / 1e12, 1), sm_copy_tb_per_s=round(ceil[1] / 1e12, 3),
                   memcpy_tb_per_s=round(ceil[2] / 1e12, 3)), flush=True)
    wts = Weights(s, "cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32)
    rows = []
    for t in p.tokens:
        for row in case_rows(s, t, wts, p, ceil):
            rows.append(row)
            print(row, flush=True)
        if cuda:
            torch.cuda.empty_cache()
    if ceil:
        rows.append(dict(tokens="ceilings", variant=f"mm {ceil[0] / 1e12:.1f} TFLOP/s, SM copy {ceil[1] / 1e12:.3f} "
                         f"TB/s (memcpy {ceil[2] / 1e12:.3f})"))
    return rows


if __name__ == "__main__":  # the same as `python -m benchmarks.kernels.run --op moe ...`
    import sys

    from benchmarks.kernels.run import main

    main(["--op", "moe", *sys.argv[1:]])
