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

The ``fp8`` preset (FP8 K/V, issue 22; ``fp8ci``: the same on tiny shapes in the interpreter) prints one table,
M3 at 128K and 1M: the sparse attention over the same selections with bf16 K/V and with e4m3 K/V + per-token
scales (Q8KV8: the plan's FP8 kernel, ``plan.fp8_prefill_uses_gluon()``), useful TFLOP/s counted as for bf16
(an e4m3 FLOP is a FLOP), the ratio bf16 time / Q8KV8 time (goal >= 1.6x and >= 600 TFLOP/s), and the whole
prefill (indexer + attention) against cuDNN bf16 dense (1M: one cold run) and against a dense FP8 baseline.
That baseline is our own Q8KV8 tile kernel over unions of every visible block (dense causal FP8 flash
attention, the same quantisation), because torch has none to offer: torch 2.13's
``scaled_dot_product_attention`` backends (math, flash, efficient, cuDNN) take fp16/bf16/fp32 only; its FP8
path is the prototype ``torch.nn.attention.experimental._scaled_dot_product_attention_quantized``, which needs
the external FA3 build (``flash_attn_interface``) registered by ``torch.nn.attention._fa3`` and takes one
descale per (batch, KV head) (``DescaleType.PER_HEAD`` only), not per-token scales. It is timed at 128K only
(at 1M it would take minutes). ``--fp8-impl triton,gluon`` (``python -m benchmarks.kernels.prefill``) also
times the listed FP8 tile kernels forced by ``TileConfig(kernel=...)`` beside the plan's; a failing one
(e.g. Gluon before its FP8 mode lands) leaves its error in the row and the table still prints.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels._common.device import device_info
from kernels._common.fp8 import quantize_rows
from kernels._common.tiles import tile_table
from kernels.indexer import msa_indexer
from kernels.sparse_prefill import PrefillShape, TileConfig, plan_prefill
from kernels.sparse_prefill.launch import launch, launch_tile
from kernels.sparse_prefill.unions import TileUnions


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
    fp8: bool = False  # the FP8 K/V table (fp8_row) instead of the bf16 rows
    dense_fp8_upto: int = 1 << 17  # the dense FP8 baseline is timed up to this many tokens


PRESETS = {
    "headline": Preset("the README's prefill rows: M3 at 128K and 1M", (("m3", 131072), ("m3", 1 << 20))),
    "m3": Preset("M3 at 32K, 64K, 128K, 256K and 1M",
                 tuple(("m3", t) for t in (32768, 65536, 131072, 262144, 1 << 20))),
    "ci": Preset("tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)",
                 (("tiny", 64), ("tiny", 128))),
    "fp8": Preset("FP8 K/V (Q8KV8) against bf16 K/V: sparse attention, whole prefill vs cuDNN bf16 and dense FP8, "
                  "M3 at 128K and 1M", (("m3", 131072), ("m3", 1 << 20)), fp8=True),
    "fp8ci": Preset("the fp8 preset on tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)",
                    (("tiny", 64), ("tiny", 128)), fp8=True),
}
FP8_IMPLS = ("triton", "gluon")  # FP8 tile kernels --fp8-impl can force
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


def attention_ms(x: dict, ids: torch.Tensor, reps: int, cuda: bool, config: TileConfig | None = None):
    """The tile design's plan for this device (``config`` overrides it) and its timed launch (the op minus its
    input checks); fp8 caches come with ``x["k_scale"]`` / ``x["v_scale"]``."""
    q = x["q"]
    args = (q, x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    plan = plan_prefill(PrefillShape.of(q, x["k_cache"], x["v_cache"], x["page_table"], ids), device_info(q.device),
                        design="tile", config=config)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device=q.device)
    scale = 1 / math.sqrt(q.shape[-1])
    scales = dict(k_scale=x.get("k_scale"), v_scale=x.get("v_scale"))
    return timed(lambda: launch(plan, *args, ids, out, lse, scale, **scales), reps, cuda), plan


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


def fp8_row(name: str, t: int, p: Preset, impls: tuple[str, ...]) -> dict:
    """One row of the fp8 table (the module docstring): bf16 and Q8KV8 attention over the same selections,
    the forced FP8 kernels of ``impls``, the whole prefill against cuDNN bf16 dense and dense FP8."""
    s = SHAPES[name]
    cuda = torch.cuda.is_available()
    x = make_inputs(t, s, "cuda" if cuda else "cpu")
    idx_args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    reps = reps_for(512 * s.d_idx / 128 * s.hkv / 4 * t * t / 500e12 * 1e3)
    t_idx = timed(lambda: msa_indexer(*idx_args, s.topk), reps, cuda)
    ids = msa_indexer(*idx_args, s.topk)
    flops = useful_attention_flops(ids, t, s)
    t_bf16, plan = attention_ms(x, ids, reps, cuda)
    k8, ks = quantize_rows(x["k_cache"])
    v8, vs = quantize_rows(x["v_cache"])
    x8 = dict(x, k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs)
    t_fp8, plan8 = attention_ms(x8, ids, reps, cuda)
    row = dict(case=f"{name} {_label(t)}", bf16_kernels=_kernels(plan), q8kv8_kernels=_kernels(plan8),
               indexer_ms=round(t_idx, 3), bf16_attention_ms=round(t_bf16, 3),
               bf16_tflops_useful=_tflops(flops, t_bf16), q8kv8_attention_ms=round(t_fp8, 3),
               q8kv8_tflops_useful=_tflops(flops, t_fp8), ratio_bf16_over_q8kv8=f"{t_bf16 / t_fp8:.2f}x")
    for impl in impls:
        if impl == plan8.kernel:
            continue
        try:
            t_impl, _ = attention_ms(x8, ids, reps, cuda, TileConfig(kernel=impl))
            row.update({f"q8kv8_{impl}_ms": round(t_impl, 3), f"q8kv8_{impl}_tflops_useful": _tflops(flops, t_impl),
                        f"ratio_bf16_over_q8kv8_{impl}": f"{t_bf16 / t_impl:.2f}x"})
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a result of this row, not the end of the table
            row[f"q8kv8_{impl}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) \
                else type(exc).__name__
    del ids
    t_dense, one_cold = dense_ms(x, s, t >= p.dense_cold_from, cuda)
    t_dense8 = dense_fp8_ms(x8, s, cuda) if t <= p.dense_fp8_upto else None
    total = t_idx + t_fp8
    row.update(bf16_total_ms=round(t_idx + t_bf16, 3), q8kv8_total_ms=round(total, 3), dense_bf16_ms=round(t_dense, 3),
               dense_bf16_tflops=_tflops(4 * s.d * s.hq * t * (t + 1) / 2, t_dense),
               speedup_q8kv8_vs_dense_bf16=f"{t_dense / total:.2f}x",
               dense_fp8_ms=None if t_dense8 is None else round(t_dense8, 3),
               speedup_q8kv8_vs_dense_fp8=None if t_dense8 is None else f"{t_dense8 / total:.2f}x",
               note="; ".join(n for n in ("dense bf16: one cold run" if one_cold else "",
                                          "" if t_dense8 is not None else "dense fp8: not timed (minutes)") if n))
    return row


def _kernels(plan) -> str:
    return f"{plan.kernel} tile + {plan.rare_pass} rare pass (rare_max {plan.rare_max})"


def dense_unions(t: int, block: int, tile_q: int, hkv: int, page_table: torch.Tensor,
                 tiles: tuple[torch.Tensor, torch.Tensor]) -> TileUnions:
    """Unions of every visible block for one request of ``t`` tokens without prefix: tile (t0.., KV head) gets
    blocks 0..own block of its last token, each marked for the tile's tokens whose own block is at or past it
    (the kernel's causal mask does the rest)."""
    tile_req, tile_start = tiles
    dev = page_table.device
    n_blocks = -(-t // block)
    blocks = torch.arange(n_blocks, device=dev, dtype=torch.int32)
    tok = tile_start[:, None].long() + torch.arange(tile_q, device=dev)  # [tiles, tile_q]
    tok_ok = (tile_req >= 0)[:, None] & (tok < t)
    own = torch.where(tok_ok, tok // block, -1)  # [tiles, tile_q]
    member = own[:, :, None] >= blocks[None, None, :]  # [tiles, tile_q, n_blocks]
    bit = torch.arange(tile_q, device=dev, dtype=torch.int32)[None, :, None]
    mask = (member.int() << bit).sum(1, dtype=torch.int32)  # distinct bits: the sum is the OR
    valid = member.any(1)  # [tiles, n_blocks]: a prefix
    union = torch.where(valid, blocks[None], -1)
    pages = torch.where(valid, page_table[0, :n_blocks][None], 0)
    count = valid.sum(-1, dtype=torch.int32)

    def heads(a):  # the same for every KV head
        return a[:, None].expand(-1, hkv, *a.shape[1:]).contiguous()

    return TileUnions(heads(union), heads(pages), heads(mask), heads(count), None)


def dense_fp8_ms(x8: dict, s: Shape, cuda: bool) -> float:
    """The dense FP8 baseline: the plan's Q8KV8 tile kernel over unions of every visible block (no rare pass,
    no regrouping), timed."""
    q = x8["q"]
    t = q.shape[0]
    ids_shape = torch.empty((t, s.hkv, s.topk), dtype=torch.int32, device=q.device)  # only its shape is read
    shape = PrefillShape.of(q, x8["k_cache"], x8["v_cache"], x8["page_table"], ids_shape)
    plan = plan_prefill(shape, device_info(q.device), design="tile", config=TileConfig(rare_max=0, group=False))
    tiles = tile_table(x8["cu_seqlens_q"], t, plan.tile_q, longest_first=False)
    union = dense_unions(t, s.block, plan.tile_q, s.hkv, x8["page_table"], tiles)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device=q.device)
    args = (plan, q, x8["k_cache"], x8["v_cache"], x8["cu_seqlens_q"], x8["seq_lens_kv"], tiles, union, out, lse,
            1 / math.sqrt(s.d), x8["k_scale"], x8["v_scale"])
    est = 4 * s.d * s.hq * t * (t + 1) / 2 / 400e12 * 1e3
    return timed(lambda: launch_tile(*args), reps_for(est), cuda)


def run(preset: str, fp8_impls: tuple[str, ...] = ()) -> list[dict]:
    """The preset's rows, one per case (each printed as it is done); ``fp8_impls``: FP8 tile kernels to force
    beside the plan's (fp8 presets)."""
    p = PRESETS[preset]
    rows = []
    for name, t in p.cases:
        rows.append(fp8_row(name, t, p, fp8_impls) if p.fp8 else case_row(name, t, p.dense_cold_from))
        print(rows[-1], flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.kernels.prefill --preset fp8 --fp8-impl triton,gluon [--json OUT]``: ``run.py``
    with the fp8 presets' extra option."""
    from benchmarks.kernels.run import environment, markdown

    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels.prefill")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--fp8-impl", default="",
                    help=f"comma-separated FP8 tile kernels to force beside the plan's ({', '.join(FP8_IMPLS)})")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    impls = tuple(i for i in args.fp8_impl.split(",") if i)
    if any(i not in FP8_IMPLS for i in impls):
        ap.error(f"--fp8-impl takes {', '.join(FP8_IMPLS)}, got {args.fp8_impl!r}")
    env = environment()
    print(json.dumps(env), flush=True)
    rows = run(args.preset, impls)
    print(markdown(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(op="prefill", preset=args.preset, env=env, rows=rows), indent=1))


if __name__ == "__main__":
    main()
