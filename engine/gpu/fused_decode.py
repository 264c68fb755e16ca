"""Fewer kernels per decoder layer for small batches on a GPU: RMSNorm fused into the matmul after it.

A decode step of a small model is bound by kernel launches, not bytes (the default model: ~310
kernels for ~0.26 GB of weights). `norm_linear` computes, in ONE kernel, s = x + delta (the residual
add), h = RMSNorm(s) * w_norm and h @ W^T, for at most 16 rows: every program recomputes the rows'
norms (K elements each, from L2) and multiplies by its BLOCK_N columns of W; program 0 also writes s
and h. With `silu=True`, W is the fused [gate; up] matrix and the kernel returns silu(gate) * up.
A layer then runs 7 kernels instead of 10: norm+QKV, RoPE+cache, attention (2), O, norm+gate/up+SwiGLU,
down (`fused_decode_layer`, attached to each layer's `fused_decode` hook by `attach`).

OFF by default (the engine attaches it only with `MSA_EVAL_FUSED_DECODE=1`): measured on an H200
(benchmarks/engine_gpu/RESULTS.md section 7) it is SLOWER than the unfused ops although it saves 90
launches per step: each of its 60 calls takes ~8.5 us against ~4 us for cuBLAS's small-M kernel plus
~1.4 us for the norm (30-48 programs each walk K twice with dependent loads). Kept for tuning
(split-K, more programs per matrix), with its tests.

Numerics: the same roundings as the unfused ops (add in the storage dtype, norm in fp32, h rounded
to the dtype, fp32 accumulation, matmul output rounded to the dtype before SwiGLU); only the
accumulation order of the matmuls differs from cuBLAS. Graphs on and off both take this path (any
forward of <= 16 rows on a GPU in bf16 / fp16), so their greedy tokens still match exactly.
Not for float32 (Triton's dot would use TF32) nor for layers with q/k norms or a QKV bias.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.gpu.ops import resolve_impl, rms_norm_ref, rope_cache, silu_mul_ref

MAX_ROWS = 16
# only layers this small (gate/up elements) are launch-bound; larger ones are bandwidth-bound, where
# cuBLAS reads the weights faster than this simple kernel (8B shape: 4.72 -> 6.83 ms per step fused)
MAX_FUSED_WEIGHT = 4 << 20


def norm_linear_ref(x: torch.Tensor, delta: torch.Tensor | None, w_norm: torch.Tensor, weight: torch.Tensor,
                    eps: float, silu: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = x if delta is None else x + delta
    h = rms_norm_ref(s, w_norm, eps)
    y = F.linear(h, weight)
    return (silu_mul_ref(y) if silu else y), s, h


@triton.jit
def _norm_linear_kernel(x_ptr, d_ptr, nw_ptr, w_ptr, out_ptr, s_ptr, h_ptr, M, N, K, eps,
                        HAS_DELTA: tl.constexpr, SILU: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 1: the rows' sums of squares
        rk = k0 + tl.arange(0, BLOCK_K)
        msk = m_ok[:, None] & (rk[None, :] < K)
        xs = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=msk, other=0.0)
        if HAS_DELTA:
            xs = xs + tl.load(d_ptr + rm[:, None] * K + rk[None, :], mask=msk, other=0.0)
        xf = xs.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
    inv = 1.0 / tl.sqrt(ss / K + eps)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):  # pass 2: normalised rows @ this program's columns
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        msk = m_ok[:, None] & k_ok[None, :]
        xs = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=msk, other=0.0)
        if HAS_DELTA:
            xs = xs + tl.load(d_ptr + rm[:, None] * K + rk[None, :], mask=msk, other=0.0)
        nw = tl.load(nw_ptr + rk, mask=k_ok, other=0.0).to(tl.float32)
        h = (xs.to(tl.float32) * inv[:, None] * nw[None, :]).to(xs.dtype)
        if pid == 0:
            if HAS_DELTA:
                tl.store(s_ptr + rm[:, None] * K + rk[None, :], xs, mask=msk)
            tl.store(h_ptr + rm[:, None] * K + rk[None, :], h, mask=msk)
        wmask = k_ok[:, None] & n_ok[None, :]
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=wmask, other=0.0)
        acc += tl.dot(h, w)
        if SILU:
            wu = tl.load(w_ptr + (rn[None, :] + N) * K + rk[:, None], mask=wmask, other=0.0)
            acc_up += tl.dot(h, wu)
    omask = m_ok[:, None] & n_ok[None, :]
    if SILU:
        g = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty)
        res = act * acc_up.to(out_ptr.dtype.element_ty)
    else:
        res = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], res, mask=omask)


def norm_linear(x: torch.Tensor, delta: torch.Tensor | None, w_norm: torch.Tensor, weight: torch.Tensor,
                eps: float, silu: bool = False, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, delta `[M, K]` (M <= 16), w_norm `[K]`, weight `[N, K]` (silu: `[2 I, K]`, gate rows first) ->
    (RMSNorm(x + delta) @ weight^T `[M, N]` (silu: silu(gate) * up `[M, I]`), s = x + delta, h = the norm)."""
    if resolve_impl(impl, x.device) == "torch":
        return norm_linear_ref(x, delta, w_norm, weight, eps, silu)
    m, k = x.shape
    n = weight.shape[0] // 2 if silu else weight.shape[0]
    if m > MAX_ROWS or not x.is_contiguous() or not weight.is_contiguous() or weight.shape[1] != k \
            or (delta is not None and (delta.shape != x.shape or not delta.is_contiguous())) or w_norm.shape != (k,):
        raise ValueError(f"norm_linear: x [M<={MAX_ROWS}, K] and delta contiguous, weight [N, K] contiguous, "
                         f"w_norm [K]; got x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    h = torch.empty_like(x)
    s = torch.empty_like(x) if delta is not None else x
    if m:
        block_n = 32
        _norm_linear_kernel[(triton.cdiv(n, block_n),)](
            x, delta if delta is not None else x, w_norm, weight, out, s, h, m, n, k, eps,
            HAS_DELTA=delta is not None, SILU=silu, BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=64, num_warps=4)
    return out, s, h


def fused_decode_layer(layer, x, delta, cos, sin, meta, cache, attn, positions):
    """`DecoderLayer.forward` for <= 16 rows with the fused kernels (same inputs, same outputs)."""
    cfg, eps = layer.cfg, layer.cfg.rms_eps
    qkv, x, h = norm_linear(x, delta, layer.in_norm, layer.qkv, eps)
    kc, vc = cache.k[layer.idx], cache.v[layer.idx]
    q = rope_cache(qkv, cos, sin, kc, vc, meta.slot_pages, meta.slot_offsets, cfg.num_heads, cfg.num_kv_heads)
    o = attn(layer.idx, q, kc, vc, meta, hidden=h, cos=cos, sin=sin, cache=cache, positions=positions)
    act, x, _ = norm_linear(F.linear(o.reshape(o.shape[0], -1), layer.o_proj), x, layer.post_norm, layer.gate_up,
                            eps, silu=True)
    return x, F.linear(act, layer.down)


def attach(model, enabled: bool = True) -> int:
    """Set (or clear) the `fused_decode` hook of every layer it suits (bf16 / fp16 weights on a GPU, a
    gate/up matrix of at most MAX_FUSED_WEIGHT elements, no q/k norm, no QKV bias, no CPU fast weights);
    returns how many layers have it."""
    n = 0
    for layer in model.layers:
        ok = (enabled and layer.qkv.is_cuda and layer.qkv.dtype in (torch.bfloat16, torch.float16)
              and layer.gate_up.numel() <= MAX_FUSED_WEIGHT and layer.q_norm is None
              and layer.qkv_bias is None and layer.fast_linears is None)
        layer.fused_decode = fused_decode_layer if ok else None
        n += ok
    return n
