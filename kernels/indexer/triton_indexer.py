"""Fused Triton MSA indexer over the paged index-key cache: score, block max and top-k in one pass.

One program owns a tile of ``TQ`` consecutive query tokens of one request times the ``H`` index
heads (``BLOCK_M = TQ * H`` MMA rows, row = token * H + head). It walks the tile's history blocks
``b = 0 .. max(L) - 1`` in order, one ``[B, d_idx]`` page per step: ``S = Q K^T`` (fp32),
row max -> block score, and an exp-free argmin-replacement update of a per-row table of the
``k - 1`` best (score, id) pairs. Because blocks arrive in ascending id order, a new block enters
only when it beats the current worst strictly, and the worst among equal scores is the larger id:
ties go to the smaller id, as the contract says. The own block is never scored (it is forced).
The epilogue sorts the table (k - 1 rounds of max / min-id) and appends the own block.

Nothing of size ``[T, n_blocks]`` is ever written (``MODE 0``). ``MODE 1`` writes the block scores
instead (for tests and for the ``torch.topk`` baseline); ``MODE 2`` computes the scores but keeps only
a per-row sum, to time the scoring alone.

The optional selected LSE is a second, small kernel over the chosen blocks (one program per
token and head); it is the only place that calls ``exp``.

FP8 index keys (``HAS_SCALE``): each key page is e4m3 with one fp32 scale per token; the dot's columns are
multiplied by the keys' scales before the row max. Without ``FP8_DOT`` the page is widened to q's dtype
(every e4m3 value is exact in bf16 and fp16); with it, q is rounded to e4m3 per row in the prologue
(``scale = max(amax |q|, 1e-12) / 448``, the rule of ``kernels._common.fp8``), the dot is e4m3 x e4m3 and
the row scale multiplies the block scores. Under the interpreter (``UPCAST``) the operands are fp32 and the
e4m3 rounding of q is computed in fp32 (``kernels._common.triton_fp8``): the interpreter's fp32 -> fp8 cast is wrong
where rounding carries into the exponent (31.99 -> 16 instead of 32).

int8 index keys (``INT8_DOT``, with their per-token scales): q is rounded to int8 per row in the prologue (the
rule of ``kernels._common.int8``) and each page scores with the exact int8 x int8 dot (int32 accumulators;
under the interpreter fp32 operands holding the integers, exact too: ``|sum| <= 127^2 * 256 < 2^24``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels._common.triton_fp8 import _quantize_int8_rows, _quantize_rows, _to_e4m3

_BIG = tl.constexpr(1 << 30)  # sentinel id of an empty table slot; real block ids are far smaller


@triton.jit
def _replace_worst(vals, ids, worst, enter, score, b):
    """Rows where ``enter``: the worst slot (lowest score, largest id among equals) takes ``(score, b)``."""
    evict = tl.max(tl.where(vals == worst[:, None], ids, -1), axis=1)
    hit = (ids == evict[:, None]) & enter[:, None]
    return tl.where(hit, score[:, None], vals), tl.where(hit, b, ids)


@triton.jit
def _indexer_fwd_kernel(Q, KC, KS, PT, CUQ, SEQ, TILE_REQ, TILE_START, IDS, SCORES, AUX,
                        stride_qt, stride_qh, stride_kp, stride_kb, stride_sp, stride_pt,
                        stride_it, stride_ih, stride_st, stride_sh, scale,
                        H: tl.constexpr, D: tl.constexpr, B: tl.constexpr, TOPK: tl.constexpr,
                        TQ: tl.constexpr, BLOCK_M: tl.constexpr, MODE: tl.constexpr, UPCAST: tl.constexpr,
                        HAS_SCALE: tl.constexpr, FP8_DOT: tl.constexpr, INT8_DOT: tl.constexpr):
    pid = tl.program_id(0)
    req = tl.load(TILE_REQ + pid)
    if req < 0:
        return
    t0 = tl.load(TILE_START + pid)
    q_beg = tl.load(CUQ + req)
    q_end = tl.load(CUQ + req + 1)
    kv_len = tl.load(SEQ + req)

    rows = tl.arange(0, BLOCK_M)
    tok = t0 + rows // H
    head = rows % H
    row_ok = (rows < TQ * H) & (tok < q_end)
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    local = tl.where(row_ok, pos // B, 0)
    n_hist = tl.max(local, axis=0)

    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, B)
    q = tl.load(Q + tok.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    row_scale = tl.zeros([BLOCK_M], tl.float32) + scale
    if FP8_DOT:
        q, q_scale = _quantize_rows(q, UPCAST)
        row_scale = row_scale * q_scale
    elif INT8_DOT:
        q, q_scale = _quantize_int8_rows(q, UPCAST)
        row_scale = row_scale * q_scale
    elif UPCAST:
        q = q.to(tl.float32)

    slot = tl.arange(0, TOPK)
    # slot TOPK-1 is not part of the history table: +inf keeps it out of every eviction
    vals = tl.where(slot[None, :] < TOPK - 1, float("-inf"), float("inf")) + tl.zeros([BLOCK_M, TOPK], tl.float32)
    ids = (_BIG + slot[None, :]) + tl.zeros([BLOCK_M, TOPK], tl.int32)
    acc = tl.zeros([BLOCK_M], tl.float32)

    pt_row = PT + req.to(tl.int64) * stride_pt
    for b in range(n_hist):
        score = _block_score(q, KC, KS, pt_row, b, stride_kp, stride_kb, stride_sp, offs_b, offs_d, row_scale,
                             UPCAST, HAS_SCALE, FP8_DOT, INT8_DOT)
        score = tl.where(b < local, score, float("-inf"))
        if MODE == 0:
            worst = tl.min(vals, axis=1)
            vals, ids = _replace_worst(vals, ids, worst, score > worst, score, b)
        elif MODE == 1:
            tl.store(SCORES + tok.to(tl.int64) * stride_st + head * stride_sh + b, score,
                     mask=row_ok & (b < local))
        else:
            acc += tl.where(b < local, score, 0.0)

    if MODE == 0:
        vals = tl.where(slot[None, :] < TOPK - 1, vals, float("-inf"))
        ids = tl.where(slot[None, :] < TOPK - 1, ids, _BIG)
        n_keep = tl.minimum(local, TOPK - 1)
        out = tl.where(slot[None, :] == n_keep[:, None], local[:, None], -1) + tl.zeros([BLOCK_M, TOPK], tl.int32)
        for j in tl.static_range(TOPK - 1):
            best = tl.max(vals, axis=1)
            best_id = tl.min(tl.where(vals == best[:, None], ids, _BIG + TOPK), axis=1)
            take = (best_id < _BIG) & (j < n_keep)
            out = tl.where((slot[None, :] == j) & take[:, None], best_id[:, None], out)
            gone = ids == best_id[:, None]
            vals = tl.where(gone, float("-inf"), vals)
            ids = tl.where(gone, _BIG, ids)
        tl.store(IDS + tok.to(tl.int64)[:, None] * stride_it + head[:, None] * stride_ih + slot[None, :],
                 out, mask=row_ok[:, None])
    elif MODE == 2:
        tl.store(AUX + tok.to(tl.int64) * H + head, acc, mask=row_ok)


@triton.jit
def _block_score(q, KC, KS, pt_row, b, stride_kp, stride_kb, stride_sp, offs_b, offs_d, row_scale,
                 UPCAST: tl.constexpr, HAS_SCALE: tl.constexpr, FP8_DOT: tl.constexpr, INT8_DOT: tl.constexpr):
    """Row max of ``q . k^T`` over logical block ``b``'s ``B`` keys (fp8 / int8 keys: times their scales), times
    the rows' ``row_scale``: fp32 ``[BLOCK_M]``."""
    page = tl.load(pt_row + b).to(tl.int64)
    k = tl.load(KC + page * stride_kp + offs_b[:, None] * stride_kb + offs_d[None, :])
    if UPCAST:
        k = k.to(tl.float32)
    elif HAS_SCALE and not (FP8_DOT or INT8_DOT):
        k = k.to(q.dtype)  # e4m3 -> bf16 / fp16: exact
    if INT8_DOT and not UPCAST:
        s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32)  # exact
    else:
        s = tl.dot(q, tl.trans(k))
    if HAS_SCALE:
        s = s * tl.load(KS + page * stride_sp + offs_b)[None, :]
    return tl.max(s, axis=1) * row_scale


@triton.jit
def _selected_lse_kernel(Q, KC, KS, PT, CUQ, SEQ, TOK_REQ, IDS, LSE,
                         stride_qt, stride_qh, stride_kp, stride_kb, stride_sp, stride_pt, stride_it, stride_ih,
                         scale, H: tl.constexpr, D: tl.constexpr, B: tl.constexpr, TOPK: tl.constexpr,
                         HAS_SCALE: tl.constexpr, FP8_DOT: tl.constexpr, INT8_DOT: tl.constexpr,
                         UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    t = pid // H
    h = pid % H
    req = tl.load(TOK_REQ + t)
    q_beg = tl.load(CUQ + req)
    q_len = tl.load(CUQ + req + 1) - q_beg
    pos = tl.load(SEQ + req) - q_len + (t - q_beg)
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, B)
    q = tl.load(Q + t.to(tl.int64) * stride_qt + h * stride_qh + offs_d).to(tl.float32)
    if FP8_DOT:  # the e4m3 row the block scores used, dequantised
        q_scale = tl.maximum(tl.max(tl.abs(q), axis=0), 1e-12) / 448.0
        q = _to_e4m3(tl.div_rn(q, q_scale), UPCAST).to(tl.float32) * q_scale
    elif INT8_DOT:  # the int8 row the block scores used, dequantised
        q_scale = tl.maximum(tl.max(tl.abs(q), axis=0), 1e-12) / 127.0
        q = ((tl.div_rn(q, q_scale) + 12582912.0) - 12582912.0) * q_scale
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.full((), 0.0, tl.float32)
    for s in range(TOPK):
        blk = tl.load(IDS + t.to(tl.int64) * stride_it + h * stride_ih + s)
        if blk >= 0:
            page = tl.load(PT + req.to(tl.int64) * stride_pt + blk).to(tl.int64)
            k = tl.load(KC + page * stride_kp + offs_b[:, None] * stride_kb + offs_d[None, :]).to(tl.float32)
            sc = tl.sum(k * q[None, :], axis=1) * scale
            if HAS_SCALE:
                sc = sc * tl.load(KS + page * stride_sp + offs_b)
            sc = tl.where(blk * B + offs_b <= pos, sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=0))
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(sc - m_new), axis=0)
            m = m_new
    lse = tl.where(l > 0, m + tl.log(l), float("-inf"))
    tl.store(LSE + pid, lse)
