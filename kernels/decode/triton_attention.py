"""Triton split-K paged decode attention (sparse over top-k pages, and dense over all pages).

Sparse, grid ``(T, Hkv, S)``: program (t, h, s) holds the G query heads of KV group h for token t
(Q tile ``[GP, d]``, GP = max(16, next_pow2(G))) and walks its share ``ceil(k / S)`` of the k
selected logical pages; each page is mapped through ``page_table`` and loaded as one
``[B, d]`` K tile and V tile; tokens ``j > pos`` and padding slots (-1) are masked (masked loads move
no bytes). Online softmax in fp32 with base-2 exponentials.

Dense, grid ``(R * NRB, Hkv, S)``: program (r, rb, h, s) holds ROWS = (query token, head) rows of
request r and group h (``q_len * G`` rows in NRB blocks of at most 128), so every K/V page is read
once per request and group for all its query tokens; the pages ``[0, ceil(seq_len / B))`` are cut
into S equal slices (slice length read from ``seq_lens`` in the kernel), causal mask per row.

With S == 1 the programs write the output directly; otherwise they write normalised partial
outputs ``ws_o [T, Hq, S, d]`` fp32 and log2-domain LSEs ``ws_lse [T, Hq, S]``, merged by
``_lse_merge_kernel`` (grid ``(T, Hq)``). Rows that see no key get output 0 and LSE -inf.

FP8 K/V (``KV_FP8``, the same kernels): each page loads e4m3 ``[B, d]`` K and V tiles (half the bytes)
and their fp32 per-token scales ``[B]`` (``kernels._common.fp8``: value = x8 * scale). Scores are
``(q . k8) * k_scale`` (the scale applied per key after the dot, on the ``[G, B]`` score tile: B
multiplies instead of B x d) and the probabilities are multiplied by ``v_scale`` per key before the PV
product (divided by the page's largest ``v_scale``, multiplied back on the ``[G, d]`` product, so the
rounded operand stays in its normal range); the fp32 online softmax and the LSE merge are unchanged.
Two ways to feed the tensor cores:

* widened (the plan's default, ``FP8_DOT=False``): K and V become fp16 in registers (e4m3 -> fp16 is one
  native conversion on sm89+, -> bf16 is not; exact), q goes to fp16 and the scaled probabilities to fp16,
  so the result is the dequantising reference up to fp16 rounding of q and p. For this memory-bound kernel
  the conversion is the price of reading half the bytes; the alternative below does not avoid it at the
  decode tile sizes: Triton 3.9 for sm90 lowers a 16-row fp8 dot (q_len 1, G = 16: below wgmma's 64 rows)
  to the same conversion and fp16 ``mma.sync`` (sm89 gets e4m3 ``mma.sync``; >= 64-row dense tiles, e.g.
  q_len 8 x G 16, get e4m3 wgmma with less shared memory).
* ``FP8_DOT`` (``kv_fp8_dot=True``): q is rounded to e4m3 once per program with a per-row scale
  ``amax / 448`` (folded into the scores with ``k_scale``), QK and PV are e4m3 x e4m3 dots with fp32
  accumulation, and a page's scaled probabilities are rounded to e4m3 as ``p * v_scale * 256 / max(v_scale)``
  (values in [0, 256]; e4m3's max is 448). Approximate beyond the cache's own rounding: q and p carry
  e4m3's 3 mantissa bits (Q8KV8, as the fp8 prefill), about twice the output error of the cache's rounding
  alone on random data.

Under the interpreter (``DOT_FP32``) every dot operand is fp32; with ``FP8_DOT`` the kernel still rounds
q and the probabilities to e4m3 first, so the interpreter checks the fp8-dot arithmetic too.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    from .launches import AttentionLaunch

LOG2E = 1.4426950408889634


@triton.jit
def _prepare_q(q, qk_scale, DOT_FP32: tl.constexpr, KV_FP8: tl.constexpr, FP8_DOT: tl.constexpr):
    """q [M, D] as the dot operand, and the per-row factor [M] that the scores take (fp8 K/V only)."""
    row_scale = tl.full([q.shape[0]], 1.0, tl.float32) * qk_scale
    if KV_FP8 and FP8_DOT:
        qf = q.to(tl.float32)
        q_scale = tl.maximum(tl.max(tl.abs(qf), axis=1), 1e-30) / 448.0
        q = (qf / q_scale[:, None]).to(tl.float8e4nv)
        row_scale = q_scale * qk_scale
    elif KV_FP8 and not DOT_FP32:
        q = q.to(tl.float16)
    if DOT_FP32:
        q = q.to(tl.float32)
    return q, row_scale


@triton.jit
def _online_softmax_page(q, row_scale, k, v, ks, vs, visible, m_i, l_i, acc, qk_scale,
                         DOT_FP32: tl.constexpr, PREC: tl.constexpr, KV_FP8: tl.constexpr, FP8_DOT: tl.constexpr):
    """One page of online softmax: q [M, D], k/v [PAGE, D], visible [M, PAGE]; fp8 K/V: ks/vs [PAGE] scales
    (0 on masked tokens) and row_scale [M] (qk_scale times the fp8-dot query scale)."""
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    elif KV_FP8 and not FP8_DOT:
        k = k.to(tl.float16)
        v = v.to(tl.float16)
    if KV_FP8:
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * row_scale[:, None] * ks[None, :]
    else:
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if KV_FP8:
        # p * v_scale, normalised by the page's largest scale (undone on the [M, D] result) so that the
        # rounded operand sits in the normal range of e4m3 (fp8 dot) or fp16 (widened)
        v_max = tl.max(vs, axis=0)
        v_max = tl.where(v_max > 0.0, v_max, 1.0)
        if FP8_DOT:  # into [0, 256] (e4m3's max is 448), rounded to e4m3
            pv = (p * (vs * (256.0 / v_max))[None, :]).to(tl.float8e4nv).to(v.dtype)
            back = v_max / 256.0
        else:
            pv = (p * (vs / v_max)[None, :]).to(v.dtype)
            back = v_max
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PREC) * back
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _load_scales(ks_ptr, vs_ptr, phys, kvh, toks, tok_ok, stride_ksp, stride_ksh, stride_vsp, stride_vsh,
                 PAGE: tl.constexpr, KV_FP8: tl.constexpr):
    """Per-token fp32 K and V scales [PAGE] of one page (0 on masked tokens); placeholders without fp8."""
    if KV_FP8:
        ks = tl.load(ks_ptr + phys * stride_ksp + kvh * stride_ksh + toks, mask=tok_ok, other=0.0)
        vs = tl.load(vs_ptr + phys * stride_vsp + kvh * stride_vsh + toks, mask=tok_ok, other=0.0)
    else:
        ks = tl.zeros([PAGE], tl.float32)
        vs = ks
    return ks, vs


@triton.jit
def _write_result(
    m_i, l_i, acc, t, head, row_ok, s, num_splits, num_q_heads,
    out_ptr, lse_ptr, ws_o_ptr, ws_lse_ptr, stride_ot, stride_oh,
    D: tl.constexpr, DIRECT: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    dims = tl.arange(0, D)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    if DIRECT:
        o_off = t[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        if WRITE_LSE:
            tl.store(lse_ptr + t * num_q_heads + head, lse2 / 1.4426950408889634, mask=row_ok)
    else:
        w_row = (t.to(tl.int64) * num_q_heads + head) * num_splits + s
        tl.store(ws_o_ptr + w_row[:, None] * D + dims[None, :], o, mask=row_ok[:, None])
        tl.store(ws_lse_ptr + w_row, lse2, mask=row_ok)


@triton.jit
def _sparse_split_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, ids_ptr, page_table_ptr, seq_lens_ptr,
    out_ptr, lse_ptr, ws_o_ptr, ws_lse_ptr,
    stride_qt, stride_qh, stride_kp, stride_kh, stride_kt, stride_vp, stride_vh, stride_vt,
    stride_ksp, stride_ksh, stride_vsp, stride_vsh,
    stride_it, stride_ih, stride_pt, stride_ot, stride_oh,
    q_len, num_splits, num_q_heads, topk, qk_scale,
    G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    DIRECT: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_FP32: tl.constexpr, PREC: tl.constexpr,
    KV_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    r = t // q_len
    pos = tl.load(seq_lens_ptr + r) - q_len + t % q_len
    g = tl.arange(0, GP)
    g_ok = g < G
    head = kvh * G + g
    dims = tl.arange(0, D)
    toks = tl.arange(0, PAGE)
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=g_ok[:, None], other=0.0)
    q, row_scale = _prepare_q(q, qk_scale, DOT_FP32, KV_FP8, FP8_DOT)
    per = tl.cdiv(topk, num_splits)
    j_lo = s * per
    j_hi = tl.minimum(j_lo + per, topk)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    for j in range(j_lo, j_hi):
        bid = tl.load(ids_ptr + t * stride_it + kvh * stride_ih + j)
        bid_safe = tl.maximum(bid, 0)
        phys = tl.load(page_table_ptr + r * stride_pt + bid_safe).to(tl.int64)
        limit = tl.where(bid >= 0, pos, -1)  # padding slot: nothing visible
        tok_ok = bid_safe * PAGE + toks <= limit
        kv_off = toks[:, None] * stride_kt + dims[None, :]
        k = tl.load(k_ptr + phys * stride_kp + kvh * stride_kh + kv_off, mask=tok_ok[:, None], other=0.0)
        v = tl.load(v_ptr + phys * stride_vp + kvh * stride_vh + kv_off, mask=tok_ok[:, None], other=0.0)
        ks, vs = _load_scales(ks_ptr, vs_ptr, phys, kvh, toks, tok_ok, stride_ksp, stride_ksh, stride_vsp,
                              stride_vsh, PAGE, KV_FP8)
        visible = tok_ok[None, :] & g_ok[:, None]
        m_i, l_i, acc = _online_softmax_page(q, row_scale, k, v, ks, vs, visible, m_i, l_i, acc, qk_scale,
                                             DOT_FP32, PREC, KV_FP8, FP8_DOT)
    t_rows = t + tl.zeros([GP], tl.int32)
    _write_result(m_i, l_i, acc, t_rows, head, g_ok, s, num_splits, num_q_heads,
                  out_ptr, lse_ptr, ws_o_ptr, ws_lse_ptr, stride_ot, stride_oh, D, DIRECT, WRITE_LSE)


@triton.jit
def _dense_split_kernel(
    q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, page_table_ptr, seq_lens_ptr,
    out_ptr, lse_ptr, ws_o_ptr, ws_lse_ptr,
    stride_qt, stride_qh, stride_kp, stride_kh, stride_kt, stride_vp, stride_vh, stride_vt,
    stride_ksp, stride_ksh, stride_vsp, stride_vsh,
    stride_pt, stride_ot, stride_oh,
    q_len, num_splits, num_q_heads, num_row_blocks, qk_scale,
    G: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    DIRECT: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_FP32: tl.constexpr, PREC: tl.constexpr,
    KV_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
):
    r = tl.program_id(0) // num_row_blocks
    rb = tl.program_id(0) % num_row_blocks
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + r)
    rows = rb * ROWS + tl.arange(0, ROWS)
    qi = rows // G
    row_ok = qi < q_len
    t = r * q_len + qi
    head = kvh * G + rows % G
    pos = seq_len - q_len + qi
    dims = tl.arange(0, D)
    toks = tl.arange(0, PAGE)
    q = tl.load(q_ptr + t[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    q, row_scale = _prepare_q(q, qk_scale, DOT_FP32, KV_FP8, FP8_DOT)
    n_pages = tl.cdiv(seq_len, PAGE)
    per = tl.cdiv(n_pages, num_splits)
    p_lo = s * per
    p_hi = tl.minimum(p_lo + per, n_pages)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for p in range(p_lo, p_hi):
        phys = tl.load(page_table_ptr + r * stride_pt + p).to(tl.int64)
        tok = p * PAGE + toks
        tok_ok = tok < seq_len
        kv_off = toks[:, None] * stride_kt + dims[None, :]
        k = tl.load(k_ptr + phys * stride_kp + kvh * stride_kh + kv_off, mask=tok_ok[:, None], other=0.0)
        v = tl.load(v_ptr + phys * stride_vp + kvh * stride_vh + kv_off, mask=tok_ok[:, None], other=0.0)
        ks, vs = _load_scales(ks_ptr, vs_ptr, phys, kvh, toks, tok_ok, stride_ksp, stride_ksh, stride_vsp,
                              stride_vsh, PAGE, KV_FP8)
        visible = (tok[None, :] <= pos[:, None]) & row_ok[:, None]
        m_i, l_i, acc = _online_softmax_page(q, row_scale, k, v, ks, vs, visible, m_i, l_i, acc, qk_scale,
                                             DOT_FP32, PREC, KV_FP8, FP8_DOT)
    _write_result(m_i, l_i, acc, t, head, row_ok, s, num_splits, num_q_heads,
                  out_ptr, lse_ptr, ws_o_ptr, ws_lse_ptr, stride_ot, stride_oh, D, DIRECT, WRITE_LSE)


@triton.jit
def _lse_merge_kernel(
    ws_o_ptr, ws_lse_ptr, out_ptr, lse_ptr, stride_ot, stride_oh, num_splits, num_q_heads,
    D: tl.constexpr, SP: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SP)
    ok = sp < num_splits
    dims = tl.arange(0, D)
    base = (t.to(tl.int64) * num_q_heads + h) * num_splits
    lse2 = tl.load(ws_lse_ptr + base + sp, mask=ok, other=float("-inf"))
    m = tl.max(lse2, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse2 - m_safe)
    o = tl.load(ws_o_ptr + (base + sp[:, None]) * D + dims[None, :], mask=ok[:, None], other=0.0)
    den = tl.sum(w, axis=0)
    den_safe = tl.where(den == 0.0, 1.0, den)
    res = tl.sum(w[:, None] * o, axis=0) / den_safe
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + dims, res.to(out_ptr.dtype.element_ty))
    if WRITE_LSE:
        lse = tl.where(den == 0.0, float("-inf"), (m_safe + tl.log2(den_safe)) / 1.4426950408889634)
        tl.store(lse_ptr + t * num_q_heads + h, lse)


def _placeholders(any_tensor, lse, ws_o, ws_lse):
    """Unused pointer arguments (no LSE requested, or S == 1 without workspace) get a real tensor
    that the kernel never touches (its use sits behind a false constexpr branch)."""
    return lse, any_tensor if ws_o is None else ws_o, any_tensor if ws_lse is None else ws_lse


def lse_arg(lse, fallback):
    return fallback if lse is None else lse


def _merge(ws_o, ws_lse, out, lse, num_splits):
    tokens, hq = out.shape[0], out.shape[1]
    _lse_merge_kernel[(tokens, hq)](
        ws_o, ws_lse, out, lse if lse is not None else ws_lse, out.stride(0), out.stride(1), num_splits, hq,
        D=out.shape[2], SP=triton.next_power_of_2(num_splits), WRITE_LSE=lse is not None, num_warps=4,
    )


def _scale_args(k_scale, v_scale, fallback):
    """Scale pointers and their (page, head) strides; without fp8 a placeholder the kernel never reads."""
    if k_scale is None:
        return (fallback, fallback), (0, 0, 0, 0)
    return (k_scale, v_scale), (k_scale.stride(0), k_scale.stride(1), v_scale.stride(0), v_scale.stride(1))


def launch_sparse(q, k_cache, v_cache, topk_ids, page_table, seq_lens, q_len, sm_scale,
                  out, lse, ws_o, ws_lse, launch: AttentionLaunch, k_scale=None, v_scale=None):
    """q/out [T, Hq, d]; lse fp32 [T, Hq] or None; ws_o [T, Hq, S, d] / ws_lse [T, Hq, S] (unused if S == 1);
    fp8 caches (``launch.kv_fp8``) with fp32 k_scale/v_scale [P, Hkv, B]."""
    tokens, hq, d = q.shape
    hkv, page = k_cache.shape[1], k_cache.shape[2]
    direct = launch.splits == 1
    lse, ws_o, ws_lse = _placeholders(seq_lens, lse, ws_o, ws_lse)
    (ks, vs), s_strides = _scale_args(k_scale, v_scale, seq_lens)
    _sparse_split_kernel[(tokens, hkv, launch.splits)](
        q, k_cache, v_cache, ks, vs, topk_ids, page_table, seq_lens,
        out, lse_arg(lse, ws_lse), ws_o, ws_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), *s_strides,
        topk_ids.stride(0), topk_ids.stride(1), page_table.stride(0), out.stride(0), out.stride(1),
        q_len, launch.splits, hq, topk_ids.shape[2], sm_scale * LOG2E,
        G=hq // hkv, GP=launch.rows, D=d, PAGE=page,
        DIRECT=direct, WRITE_LSE=lse is not None, DOT_FP32=launch.dot_fp32, PREC=launch.precision,
        KV_FP8=launch.kv_fp8, FP8_DOT=launch.fp8_dot,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    if not direct:
        _merge(ws_o, ws_lse, out, lse, launch.splits)
    return out


def launch_dense(q, k_cache, v_cache, page_table, seq_lens, q_len, sm_scale,
                 out, lse, ws_o, ws_lse, launch: AttentionLaunch, k_scale=None, v_scale=None):
    """Same buffers as launch_sparse, over all pages of each request."""
    tokens, hq, d = q.shape
    hkv, page = k_cache.shape[1], k_cache.shape[2]
    direct = launch.splits == 1
    lse, ws_o, ws_lse = _placeholders(seq_lens, lse, ws_o, ws_lse)
    (ks, vs), s_strides = _scale_args(k_scale, v_scale, seq_lens)
    _dense_split_kernel[(seq_lens.shape[0] * launch.row_blocks, hkv, launch.splits)](
        q, k_cache, v_cache, ks, vs, page_table, seq_lens,
        out, lse_arg(lse, ws_lse), ws_o, ws_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), *s_strides,
        page_table.stride(0), out.stride(0), out.stride(1),
        q_len, launch.splits, hq, launch.row_blocks, sm_scale * LOG2E,
        G=hq // hkv, ROWS=launch.rows, D=d, PAGE=page,
        DIRECT=direct, WRITE_LSE=lse is not None, DOT_FP32=launch.dot_fp32, PREC=launch.precision,
        KV_FP8=launch.kv_fp8, FP8_DOT=launch.fp8_dot,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    if not direct:
        _merge(ws_o, ws_lse, out, lse, launch.splits)
    return out
