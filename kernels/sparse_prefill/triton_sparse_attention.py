"""Triton kernels for MSA sparse attention over the paged KV cache (forward only).

Two designs, same math (see ``naive.py``), base-2 online softmax in fp32:

* ``_token_kernel`` (the simple one, kept as the fallback): one program per (query token, KV
  head); the MMA rows are the group's ``G`` query heads padded to ``GP >= 16``; it loops over the
  token's valid selected blocks, one ``[B, d]`` K and V page each.
* ``_tile_kernel`` (tile sharing): one program per (tile of ``TQ`` consecutive tokens of one
  request, KV head); the MMA rows are ``TQ x G`` (token, head) pairs, so every K/V page loaded
  serves all the tile's tokens that selected it. It loops over the tile's union of selected
  blocks (built by ``_union_kernel``, physical pages resolved there, so the loop has no dependent
  page-table load); a row takes part in a block only if its token selected it (its bit in the
  block's token mask, applied as a -inf row bias folded into the scale FMA), and the causal mask
  (``key_pos <= pos``) is applied only on blocks that reach past the tile's first position (the own
  block), so other blocks cost what plain flash attention costs. Blocks that few of the tile's
  tokens chose can be left out of the union (``RARE_MAX``) and added afterwards per token by
  ``_token_kernel`` in ``MERGE`` mode.

Rows with nothing visible yet keep ``m = -inf``; the exponent reference is then 0 so that
``exp2(-inf - ref) = 0`` and no NaN appears. An empty selection gives ``out = 0``, ``lse = -inf``.
"""
from __future__ import annotations

import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _online_update(qk, valid, m_i, l_i, acc, v):
    """One block of the base-2 online softmax; ``qk`` is already scaled by ``scale * log2(e)``."""
    qk = tl.where(valid, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(qk - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _online_update_masked(s, m_i, l_i, acc, v):
    """Same as ``_online_update`` for scores already scaled and masked (-inf where not visible)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _store_out(OUT, LSE, out_rows, lse_rows, row_ok, offs_d, m_i, l_i, acc):
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(tl.where(nonempty, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(OUT + out_rows[:, None] + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + lse_rows, lse, mask=row_ok)


@triton.jit
def _token_kernel(Q, KC, VC, PT, CUQ, SEQ, TOK_REQ, IDS, OUT, LSE,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_it, stride_ih, stride_ot, stride_oh, qk_scale,
                  HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
                  TOPK: tl.constexpr, UPCAST: tl.constexpr, MERGE: tl.constexpr = False):
    """``MERGE``: ``OUT``/``LSE`` already hold attention over other blocks (the tile kernel's common
    blocks); the token's ``IDS`` (its rare blocks) are added to that state; no ids: nothing written."""
    pid = tl.program_id(0)
    t = pid // HKV
    g = pid % HKV
    id_row = IDS + t.to(tl.int64) * stride_it + g * stride_ih
    n_valid = tl.sum((tl.load(id_row + tl.arange(0, TOPK)) >= 0).to(tl.int32), axis=0)
    if MERGE:
        if n_valid == 0:
            return
    req = tl.load(TOK_REQ + t)
    q_beg = tl.load(CUQ + req)
    pos = tl.load(SEQ + req) - (tl.load(CUQ + req + 1) - q_beg) + (t - q_beg)

    rows = tl.arange(0, GP)
    row_ok = rows < G
    head = g * G + rows
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, B)
    q = tl.load(Q + t.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    out_rows = t.to(tl.int64) * stride_ot + head * stride_oh
    lse_rows = t.to(tl.int64) * (HKV * G) + head
    if MERGE:  # normalised out with l = 1 at m = lse (base 2): the online state it stands for
        lse_in = tl.load(LSE + lse_rows, mask=row_ok, other=float("-inf"))
        m_i = lse_in * 1.4426950408889634
        l_i = tl.where(lse_in > float("-inf"), 1.0, 0.0)
        acc = tl.load(OUT + out_rows[:, None] + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    else:
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
    pt_row = PT + req.to(tl.int64) * stride_pt
    for s in range(0, n_valid):
        blk = tl.load(id_row + s)
        page = tl.load(pt_row + blk).to(tl.int64)
        k = tl.load(KC + page * stride_kp + g * stride_kh + offs_b[:, None] * stride_kb + offs_d[None, :])
        v = tl.load(VC + page * stride_vp + g * stride_vh + offs_b[:, None] * stride_vb + offs_d[None, :])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        visible = (blk * B + offs_b <= pos)[None, :]
        m_i, l_i, acc = _online_update(qk, visible, m_i, l_i, acc, v)
    _store_out(OUT, LSE, out_rows, lse_rows, row_ok, offs_d, m_i, l_i, acc)


@triton.jit
def _tile_kernel(Q, KC, VC, CUQ, SEQ, TILE_REQ, TILE_START, UNION, UPAGE, UMASK, UCOUNT, OUT, LSE,
                 stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                 stride_ot, stride_oh, stride_ut, stride_uh, qk_scale,
                 HKV: tl.constexpr, G: tl.constexpr, TQ: tl.constexpr, BLOCK_M: tl.constexpr,
                 D: tl.constexpr, B: tl.constexpr, UPCAST: tl.constexpr):
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
    tok = t0 + rows // G
    head = g * G + rows % G
    row_ok = (rows < TQ * G) & (tok < q_end)
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    pos_min = tl.min(tl.where(row_ok, pos, 2147483647), axis=0)
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, B)
    tok64 = tok.to(tl.int64)
    q = tl.load(Q + tok64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    row_bit = rows // G  # the row's token within the tile: its bit in the block's token mask

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    u_off = tile.to(tl.int64) * stride_ut + g * stride_uh
    n_union = tl.load(UCOUNT + tile * HKV + g)
    for u in range(0, n_union):
        blk = tl.load(UNION + u_off + u)
        page = tl.load(UPAGE + u_off + u).to(tl.int64)  # physical page, resolved by the union kernel
        k = tl.load(KC + page * stride_kp + g * stride_kh + offs_b[:, None] * stride_kb + offs_d[None, :])
        v = tl.load(VC + page * stride_vp + g * stride_vh + offs_b[:, None] * stride_vb + offs_d[None, :])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        # rows whose token did not select this block get a -inf bias, folded into the scale FMA
        member = ((tl.load(UMASK + u_off + u) >> row_bit) & 1) != 0
        s = tl.dot(q, tl.trans(k)) * qk_scale + tl.where(member, 0.0, float("-inf"))[:, None]
        if blk * B + (B - 1) > pos_min:  # a key of this block lies past some row: causal mask
            s = tl.where((blk * B + offs_b)[None, :] <= pos[:, None], s, float("-inf"))
        m_i, l_i, acc = _online_update_masked(s, m_i, l_i, acc, v)
    _store_out(OUT, LSE, tok64 * stride_ot + head * stride_oh, tok64 * (HKV * G) + head,
               row_ok, offs_d, m_i, l_i, acc)


@triton.jit
def _union_kernel(IDS, PT, CUQ, TILE_REQ, TILE_START, UNION, UPAGE, UMASK, UCOUNT, RARE,
                  stride_it, stride_ih, stride_pt, stride_ut, stride_uh, stride_rt, stride_rh,
                  HKV: tl.constexpr, TQ: tl.constexpr, TOPK: tl.constexpr, RARE_MAX: tl.constexpr):
    """Union of the selected blocks of one (tile, KV head), de-duplicated and compacted in order of
    first appearance (token by token), with the physical page of each block and the bitmask of the
    tile's tokens that selected it (int32, bit j = token t0 + j, TQ <= 32); -1 after ``count``.

    ``RARE_MAX > 0``: blocks selected by at most ``RARE_MAX`` of the tile's tokens stay out of the
    union; each token's such blocks go to ``RARE [T, Hkv, TOPK]`` instead (compacted, -1 after).
    """
    pid = tl.program_id(0)
    tile = pid // HKV
    g = pid % HKV
    req = tl.load(TILE_REQ + tile)
    t0 = tl.load(TILE_START + tile)
    q_end = tl.where(req >= 0, tl.load(CUQ + tl.maximum(req, 0) + 1), 0)  # surplus tile: nothing valid
    NP: tl.constexpr = TQ * TOPK  # a power of two: TQ and TOPK are
    idx = tl.arange(0, NP)
    tok_of = idx // TOPK
    tok = t0 + tok_of
    ok = tok < q_end
    ids = tl.load(IDS + tok.to(tl.int64) * stride_it + g * stride_ih + idx % TOPK, mask=ok, other=-1)
    # per id: the bitmask of the tile's tokens that selected it (a token's own ids are distinct);
    # it is a duplicate iff an earlier token's bit is set
    if NP <= 128:  # one all-pairs compare (the H200-measured path of the M3 shape)
        same = (ids[:, None] == ids[None, :]) & (ids[:, None] >= 0)
        # distinct bits: the sum is the OR (bit 31 wraps to the sign bit, which is still bit 31)
        tokmask = tl.sum(tl.where(same, 1 << tok_of[None, :], 0), axis=1)
    else:  # TQ compares of [NP, TOPK]: keeps the live tiles small up to TQ * TOPK = 1024
        tokmask = tl.zeros([NP], tl.int32)
        slots = tl.arange(0, TOPK)
        for jt in tl.static_range(TQ):
            row = tl.load(IDS + (t0 + jt).to(tl.int64) * stride_it + g * stride_ih + slots,
                          mask=(slots * 0 + t0 + jt) < q_end, other=-2)
            hit = tl.max((ids[:, None] == row[None, :]).to(tl.int32), axis=1)
            tokmask = tokmask | (hit << jt)
    earlier = tokmask & ((1 << tok_of) - 1)
    keep = (ids >= 0) & (earlier == 0)
    if RARE_MAX > 0:
        n_tok = tl.zeros([NP], tl.int32)
        for jt in tl.static_range(TQ):
            n_tok += (tokmask >> jt) & 1
        rare = (ids >= 0) & (n_tok <= RARE_MAX)
        keep = keep & (n_tok > RARE_MAX)
        rare2 = tl.reshape(rare.to(tl.int32), [TQ, TOPK])
        col = tl.arange(0, TOPK)[None, :]
        r_slot = tl.cumsum(rare2, axis=1) - 1
        r_cnt = tl.sum(rare2, axis=1)
        tok2 = t0 + tl.arange(0, TQ)
        r_base = RARE + tok2.to(tl.int64)[:, None] * stride_rt + g * stride_rh
        tok_ok = (tok2 < q_end)[:, None]
        tl.store(r_base + r_slot, tl.reshape(ids, [TQ, TOPK]), mask=tok_ok & (rare2 > 0))
        tl.store(r_base + col, -1, mask=tok_ok & (col >= r_cnt[:, None]))
    slot = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    count = tl.sum(keep.to(tl.int32), axis=0)
    page = tl.load(PT + tl.maximum(req, 0).to(tl.int64) * stride_pt + ids, mask=keep, other=0)
    base = tile.to(tl.int64) * stride_ut + g * stride_uh
    tl.store(UNION + base + slot, ids, mask=keep)
    tl.store(UPAGE + base + slot, page, mask=keep)
    tl.store(UMASK + base + slot, tokmask, mask=keep)
    tl.store(UNION + base + idx, -1, mask=idx >= count)
    tl.store(UPAGE + base + idx, 0, mask=idx >= count)
    tl.store(UMASK + base + idx, 0, mask=idx >= count)
    tl.store(UCOUNT + pid, count)
