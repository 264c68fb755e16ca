"""Triton kernels for MSA sparse attention over the paged KV cache (forward only).

Two designs, same math (see ``naive.py``), base-2 online softmax in fp32:

* ``_token_kernel`` (the simple one, kept as the fallback): one program per (query token, KV
  head); the MMA rows are the group's ``G`` query heads padded to ``GP >= 16``; it loops over the
  token's valid selected blocks, ``KN`` keys per step. ``MERGE``: the blocks are added to the
  normalised output already in ``OUT`` / ``LSE`` (the tile kernel's rare pass).
* ``_tile_kernel`` (tile sharing): one program per (tile of ``TQ`` tokens of one request, KV head);
  the MMA rows are ``TQ x G`` (token, head) pairs, so every K/V page loaded serves all the tile's
  tokens that selected it. It loops over the tile's union of selected blocks (built by
  ``_union_kernel``, physical pages resolved there, so the loop has no dependent page-table load),
  ``BN`` keys per step; a row takes part in a block only if its token selected it (its bit in the
  block's token mask, a -inf row bias folded into the exponent's reference: one FMA per score), and
  the causal mask (``key_pos <= pos``) is applied only on steps that reach past the tile's first
  position (the own block), so other blocks cost what plain flash attention costs. Blocks that few
  of the tile's tokens chose are left out of the union and added afterwards per token by
  ``_token_kernel`` in ``MERGE`` mode. ``GROUPED``: the tile's tokens come from the regrouping's
  token map; ``TMA``: K / V steps through tensor descriptors (Hopper and newer, contiguous caches).

Rows with nothing visible yet keep ``m = -inf``; the exponent reference is then 0 so that
``exp2(-inf - ref) = 0`` and no NaN appears. An empty selection gives ``out = 0``, ``lse = -inf``.

FP8 (e4m3) K/V, Q8KV8 (``FP8``, both kernels; caches ``[pages, Hkv, B, d]`` e4m3 with fp32 scales ``KS`` /
``VS [pages, Hkv, B]``, ``kernels._common.fp8``: value = x8 * scale):

* q is rounded to e4m3 once per program, per (token, head) row by the shared rule (``scale = max(amax,
  1e-12) / 448``, ``tl.div_rn``); the QK product is an e4m3 x e4m3 dot with fp32 accumulation and its
  scores are multiplied by ``q_scale[row] * k_scale[key]`` (times ``scale * log2(e)``);
* fp32 online softmax with the running max, whose reference is rounded up to an integer (``ceil``): the
  probabilities ``p = exp2(s - ref)`` stay in (0, 1], the rescale factors become exact powers of two, and
  the result no longer depends on where in the loop the max was found (``naive``'s ``q8kv8`` mode models
  it in one pass, so the kernels are held to a tight bound);
* each step's probabilities are scaled by ``v_scale[key] * 256 / vmax`` (``vmax`` = the step's largest
  v-scale; keys at or past the request's length load scale 0) into [0, 256] (e4m3's max is 448; small
  probabilities keep e4m3's normal range down to ``2^-14``), rounded to e4m3 (nearest even) for an
  e4m3 x e4m3 PV dot, and the product is multiplied by ``vmax / 256`` (the tile kernel keeps its
  accumulator in units of the last step's ``vmax / 256``, folding the change into the rescale ``alpha`` so that
  the dot accumulates in place, one multiply per output element at the end). Deterministic, not exact in
  expectation: the rounding of q and p adds to the cache's own (the error bounds are in
  ``tests/kernels/test_sparse_prefill_fp8.py``).

Under the interpreter (``UPCAST``) the dot operands are fp32 and the e4m3 roundings of q and p are computed
in fp32 (``kernels._common.triton_fp8._to_e4m3``: the interpreter's own fp32 -> fp8 cast is wrong where
the rounding carries into the exponent), so the interpreter checks the same arithmetic.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels._common.triton_fp8 import _quantize_rows, _to_e4m3

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _v_factors(vs):
    """One step's keys' v-scales ``vs [N]`` (0 on keys past the request) -> (``vs * 256 / vmax`` ``[N]``, the
    factor the probabilities take before their e4m3 rounding; ``vmax / 256``, the one the product takes)."""
    v_max = tl.max(vs, axis=0)
    v_max = tl.where(v_max > 0.0, v_max, 1.0)
    return vs * tl.div_rn(tl.full([1], 256.0, tl.float32), v_max), v_max / 256.0


@triton.jit
def _pv_fp8(p, v, vs, UPCAST: tl.constexpr):
    """``p [M, N] @ (v8 * v_scale) [N, D]`` as an e4m3 x e4m3 dot (``_v_factors``)."""
    c, back = _v_factors(vs)
    return tl.dot(_to_e4m3(p * c[None, :], UPCAST), v) * back


@triton.jit
def _online_update(qk, valid, m_i, l_i, acc, v, vs, FP8: tl.constexpr = False, UPCAST: tl.constexpr = False):
    """One block of the base-2 online softmax; ``qk`` is already scaled by ``scale * log2(e)`` (FP8: and by
    the q and k scales); ``vs`` the keys' v-scales (FP8 only)."""
    qk = tl.where(valid, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    if FP8:  # an integer reference: p in (0, 1], exact power-of-two rescales
        m_new = tl.ceil(m_new)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if FP8:
        acc = acc * alpha[:, None] + _pv_fp8(p, v, vs, UPCAST)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _prepare_q(q, qk_scale, UPCAST: tl.constexpr, FP8: tl.constexpr):
    """q ``[M, D]`` as the QK dot operand and the per-row factor ``[M]`` of its scores: ``qk_scale``, or with
    FP8 q rounded to e4m3 per row and ``q_scale * qk_scale``."""
    row_scale = tl.full([q.shape[0]], 1.0, tl.float32) * qk_scale
    if FP8:
        q, q_scale = _quantize_rows(q, UPCAST)
        row_scale = q_scale * qk_scale
    elif UPCAST:
        q = q.to(tl.float32)
    return q, row_scale


@triton.jit
def _load_scales(KS, VS, page, g, key, ok, stride_ksp, stride_ksh, stride_vsp, stride_vsh, FP8: tl.constexpr):
    """The keys' fp32 k and v scales (0 where not ``ok``); zeros without FP8 (unused)."""
    if FP8:
        ks = tl.load(KS + page * stride_ksp + g * stride_ksh + key, mask=ok, other=0.0)
        vs = tl.load(VS + page * stride_vsp + g * stride_vsh + key, mask=ok, other=0.0)
    else:
        ks = tl.zeros(key.shape, tl.float32)
        vs = ks
    return ks, vs


@triton.jit
def _store_out(OUT, LSE, out_rows, lse_rows, row_ok, offs_d, m_i, l_i, acc):
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(tl.where(nonempty, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(OUT + out_rows[:, None] + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + lse_rows, lse, mask=row_ok)


@triton.jit
def _token_attend(Q, KC, VC, PT, CUQ, SEQ, OUT, LSE, KS, VS, t, g, req, id_row, n_valid, merge,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_ot, stride_oh, stride_ksp, stride_ksh, stride_vsp, stride_vsh, qk_scale,
                  HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
                  UPCAST: tl.constexpr, KN: tl.constexpr = 0, FP8: tl.constexpr = False):
    """Attention of token ``t``'s group ``g`` (rows = its G heads) over the ``n_valid`` blocks at
    ``id_row``, ``KN`` keys per step (0: the whole block); ``merge``: start from the normalised
    ``OUT`` / ``LSE`` already there."""
    BK: tl.constexpr = B if KN == 0 else KN
    NSUB: tl.constexpr = B // BK
    q_beg = tl.load(CUQ + req)
    kv_len = tl.load(SEQ + req)
    pos = kv_len - (tl.load(CUQ + req + 1) - q_beg) + (t - q_beg)

    rows = tl.arange(0, GP)
    row_ok = rows < G
    head = g * G + rows
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, BK)
    q = tl.load(Q + t.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    q, row_scale = _prepare_q(q, qk_scale, UPCAST, FP8)

    out_rows = t.to(tl.int64) * stride_ot + head * stride_oh
    lse_rows = t.to(tl.int64) * (HKV * G) + head
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    if merge:  # normalised out with l = 1 at m = lse (base 2): the online state it stands for
        lse_in = tl.load(LSE + lse_rows, mask=row_ok, other=float("-inf"))
        m_i = lse_in * 1.4426950408889634
        l_i = tl.where(lse_in > float("-inf"), 1.0, 0.0)
        acc = tl.load(OUT + out_rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    pt_row = PT + req.to(tl.int64) * stride_pt
    for s in range(n_valid * NSUB):
        blk = tl.load(id_row + s // NSUB)
        key = (s % NSUB) * BK + offs_b  # the step's keys within the block
        page = tl.load(pt_row + blk).to(tl.int64)
        k = tl.load(KC + page * stride_kp + g * stride_kh + key[:, None] * stride_kb + offs_d[None, :])
        v = tl.load(VC + page * stride_vp + g * stride_vh + key[:, None] * stride_vb + offs_d[None, :])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        ks, vs = _load_scales(KS, VS, page, g, key, blk * B + key < kv_len, stride_ksp, stride_ksh, stride_vsp,
                              stride_vsh, FP8)
        if FP8:
            qk = tl.dot(q, tl.trans(k)) * row_scale[:, None] * ks[None, :]
        else:
            qk = tl.dot(q, tl.trans(k)) * qk_scale
        visible = (blk * B + key <= pos)[None, :]
        m_i, l_i, acc = _online_update(qk, visible, m_i, l_i, acc, v, vs, FP8, UPCAST)
    _store_out(OUT, LSE, out_rows, lse_rows, row_ok, offs_d, m_i, l_i, acc)


@triton.jit
def _token_kernel(Q, KC, VC, PT, CUQ, SEQ, TOK_REQ, IDS, OUT, LSE, KS, VS,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_it, stride_ih, stride_ot, stride_oh, stride_ksp, stride_ksh, stride_vsp,
                  stride_vsh, qk_scale,
                  HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
                  TOPK: tl.constexpr, UPCAST: tl.constexpr, MERGE: tl.constexpr = False, KN: tl.constexpr = 0,
                  FP8: tl.constexpr = False):
    """``MERGE``: ``OUT``/``LSE`` already hold attention over other blocks (the tile kernel's common
    blocks); the token's ``IDS`` (its rare blocks) are added to that state; no ids: nothing written.
    ``FP8``: e4m3 caches with the fp32 scales ``KS`` / ``VS`` (Q8KV8, the module docstring)."""
    pid = tl.program_id(0)
    t = pid // HKV
    g = pid % HKV
    slots = tl.arange(0, TOPK)
    req = tl.load(TOK_REQ + t)  # independent of the loads below: one round trip for all of them
    id_row = IDS + t.to(tl.int64) * stride_it + g * stride_ih
    n_valid = tl.sum((tl.load(id_row + slots) >= 0).to(tl.int32), axis=0)
    if MERGE:
        if n_valid == 0:
            return
    _token_attend(Q, KC, VC, PT, CUQ, SEQ, OUT, LSE, KS, VS, t, g, req, id_row, n_valid, MERGE,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_ot, stride_oh, stride_ksp, stride_ksh, stride_vsp, stride_vsh, qk_scale,
                  HKV, G, GP, D, B, UPCAST, KN, FP8)


@triton.jit
def _tile_block(s_raw, key0, bits, row_bit, pos, pos_min, offs_b, qk_scale, m_i, l_i, acc, acc_scale, v, vs,
                BN: tl.constexpr, FP8: tl.constexpr = False, UPCAST: tl.constexpr = False):
    """Online-softmax update of the tile state by ``BN`` keys of one union block (the first at position
    ``key0``) from their raw scores ``Q K^T``; the scale and the membership bias are folded into the
    exponent's reference (``exp2(s * scale - ref)``: one FMA per score). ``FP8``: ``s_raw`` already carries
    the k scales and ``qk_scale`` is per row (``q_scale * scale * log2(e)``), the reference is ceiled, ``vs``
    (the keys' v-scales) go into the e4m3 PV dot, and ``acc`` is kept in units of ``acc_scale`` (the last
    step's ``vmax / 256``), so the step's factor joins ``alpha`` and the dot still accumulates in place."""
    bias = tl.where(((bits >> row_bit) & 1) != 0, 0.0, float("-inf"))  # rows whose token chose it
    if key0 + (BN - 1) > pos_min:  # a key of this step lies past some row: causal mask
        s_raw = tl.where((key0 + offs_b)[None, :] <= pos[:, None], s_raw, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s_raw, axis=1) * qk_scale + bias)  # scale > 0: max of scaled = scaled max
    if FP8:  # an integer reference (non-member rows keep m_i, already one)
        m_new = tl.ceil(m_new)
    alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))  # 0 while m_i = -inf
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    if FP8:
        p = tl.exp2(s_raw * qk_scale[:, None] - (m_ref - bias)[:, None])
        c, back = _v_factors(vs)
        acc = tl.dot(_to_e4m3(p * c[None, :], UPCAST), v, acc * (alpha * (acc_scale / back))[:, None])
        acc_scale = back
    else:
        p = tl.exp2(s_raw * qk_scale - (m_ref - bias)[:, None])  # non-member rows: reference +inf, p = 0
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, acc, acc_scale


@triton.jit
def _tile_kernel(Q, KC, VC, CUQ, SEQ, TILE_REQ, TILE_START, UNION, UPAGE, UMASK, UCOUNT, OUT, LSE, TOKMAP,
                 KDESC, VDESC, KS, VS, stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh,
                 stride_vb, stride_ot, stride_oh, stride_ut, stride_uh, stride_ksp, stride_ksh, stride_vsp,
                 stride_vsh, qk_scale,
                 HKV: tl.constexpr, G: tl.constexpr, TQ: tl.constexpr, BLOCK_M: tl.constexpr,
                 D: tl.constexpr, B: tl.constexpr, UPCAST: tl.constexpr, BN: tl.constexpr = 0,
                 GROUPED: tl.constexpr = False, TMA: tl.constexpr = False, FP8: tl.constexpr = False):
    """One program per (tile, KV head): rows = ``TQ`` tokens x ``G`` heads; each loop step takes ``BN``
    keys of a union block (0: the whole block, ``B``). ``GROUPED``: the tile's tokens are
    ``TOKMAP[tile, g, :]`` (-1: empty slot) instead of ``t0 + j``. ``TMA``: the union loop's K / V
    steps come through the tensor descriptors ``KDESC`` / ``VDESC`` over the contiguous caches seen as
    ``[pages * HKV * B, D]`` (row ``(page * HKV + g) * B + key``: the copy engine fills shared memory,
    no address registers) instead of pointer loads. ``FP8``: e4m3 caches with the fp32 scales ``KS`` /
    ``VS`` (Q8KV8, the module docstring)."""
    KN: tl.constexpr = B if BN == 0 else BN
    NSUB: tl.constexpr = B // KN
    pid = tl.program_id(0)
    tile = pid // HKV
    g = pid % HKV
    req = tl.load(TILE_REQ + tile)
    if req < 0:
        return
    t0 = tl.load(TILE_START + tile)
    q_beg = tl.load(CUQ + req)
    q_end = tl.load(CUQ + req + 1)
    kv_len = tl.load(SEQ + req)

    rows = tl.arange(0, BLOCK_M)
    if GROUPED:
        tok = tl.load(TOKMAP + (tile * HKV + g).to(tl.int64) * TQ + rows // G, mask=rows < TQ * G, other=-1)
        row_ok = tok >= 0
        tok = tl.maximum(tok, 0)
    else:
        tok = t0 + rows // G
        row_ok = (rows < TQ * G) & (tok < q_end)
    head = g * G + rows % G
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    pos_min = tl.min(tl.where(row_ok, pos, 2147483647), axis=0)
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, KN)
    tok64 = tok.to(tl.int64)
    q = tl.load(Q + tok64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    q, row_scale = _prepare_q(q, qk_scale, UPCAST, FP8)  # FP8: q_scale * qk_scale per row
    row_bit = rows // G  # the row's token within the tile: its bit in the block's token mask

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    acc_scale = 1.0  # FP8: acc is in units of this (the last step's vmax / 256)
    u_off = tile.to(tl.int64) * stride_ut + g * stride_uh
    n_union = tl.load(UCOUNT + tile * HKV + g)
    for it in range(n_union * NSUB):
        u = it // NSUB
        koff = (it % NSUB) * KN
        blk = tl.load(UNION + u_off + u)
        page = tl.load(UPAGE + u_off + u).to(tl.int64)  # physical page, resolved by the union kernel
        if TMA:
            row = ((page * HKV + g) * B + koff).to(tl.int32)
            k = KDESC.load([row, 0])
            v = VDESC.load([row, 0])
        else:
            k = tl.load(KC + page * stride_kp + g * stride_kh + (koff + offs_b)[:, None] * stride_kb + offs_d[None, :])
            v = tl.load(VC + page * stride_vp + g * stride_vh + (koff + offs_b)[:, None] * stride_vb + offs_d[None, :])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        bits = tl.load(UMASK + u_off + u)
        ks, vs = _load_scales(KS, VS, page, g, koff + offs_b, blk * B + koff + offs_b < kv_len, stride_ksp,
                              stride_ksh, stride_vsp, stride_vsh, FP8)
        if FP8:
            m_i, l_i, acc, acc_scale = _tile_block(tl.dot(q, tl.trans(k)) * ks[None, :], blk * B + koff, bits,
                                                   row_bit, pos, pos_min, offs_b, row_scale, m_i, l_i, acc,
                                                   acc_scale, v, vs, KN, FP8, UPCAST)
        else:
            m_i, l_i, acc, acc_scale = _tile_block(tl.dot(q, tl.trans(k)), blk * B + koff, bits, row_bit, pos,
                                                   pos_min, offs_b, qk_scale, m_i, l_i, acc, acc_scale, v, vs, KN)
    if FP8:
        acc = acc * acc_scale
    _store_out(OUT, LSE, tok64 * stride_ot + head * stride_oh, tok64 * (HKV * G) + head,
               row_ok, offs_d, m_i, l_i, acc)
