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
* Tile options (constexpr, measured in ``benchmarks/prefill/RESULTS.md`` run 5): ``HSPLIT`` splits
  the group's heads over that many programs (``TQ x G / HSPLIT`` rows each: 64-row programs that
  fit two per SM); ``LAZY`` rescales the accumulator only when some row's running max grew by more
  than 8 (base 2; exact: the reference is merely stale, FlashAttention-4's conditional rescale);
  ``EXP_FMA`` folds the scale and the membership bias into the exponent's reference
  (``exp2(s * scale - ref)``: one FMA per score instead of an FMA and a subtract).
* ``BN`` (run 6): keys per loop step of the tile kernel (``B / BN`` steps per union block, the causal
  mask per step); with 64-key steps and a 128-register cap two 8-warp programs share an SM.
* ``_rare_window_kernel`` (opt-in ``rare_pass="window"``): the rare pairs merged per window of 128
  tokens, the tokens that chose the same block sharing its K/V read (measured slower, see there).
* ``TMA`` (run 7, default for 128-row tiles on Hopper): the tile loop's K / V steps come through
  tensor descriptors (the copy engine fills shared memory; 3-4% faster tile loop). ``TAIL`` and
  ``HEAD_MAJOR`` (run 7, opt-in, not faster): the rare blocks added by the tile program itself
  after its store; programs ordered KV head by KV head.
* ``GATED`` (the no-sync ``design="auto"``): a device flag (1 = tile design) makes the tile kernel
  exit at once when 0, and the token kernel run plain over ``IDS`` when 0 or merge over ``RARE``
  when 1, so the choice needs no host sync.

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
def _store_out(OUT, LSE, out_rows, lse_rows, row_ok, offs_d, m_i, l_i, acc):
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, (m_i + tl.log2(tl.where(nonempty, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    tl.store(OUT + out_rows[:, None] + offs_d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + lse_rows, lse, mask=row_ok)


@triton.jit
def _token_attend(Q, KC, VC, PT, CUQ, SEQ, OUT, LSE, t, g, req, id_row, n_valid, merge,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_ot, stride_oh, qk_scale, HKV: tl.constexpr, G: tl.constexpr,
                  GP: tl.constexpr, D: tl.constexpr, B: tl.constexpr, UPCAST: tl.constexpr, KN: tl.constexpr = 0):
    """Attention of token ``t``'s group ``g`` (rows = its G heads) over the ``n_valid`` blocks at
    ``id_row``, ``KN`` keys per step (0: the whole block); ``merge``: start from the normalised
    ``OUT`` / ``LSE`` already there."""
    BK: tl.constexpr = B if KN == 0 else KN
    NSUB: tl.constexpr = B // BK
    q_beg = tl.load(CUQ + req)
    pos = tl.load(SEQ + req) - (tl.load(CUQ + req + 1) - q_beg) + (t - q_beg)

    rows = tl.arange(0, GP)
    row_ok = rows < G
    head = g * G + rows
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, BK)
    q = tl.load(Q + t.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

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
    for s in range(0, n_valid * NSUB):
        blk = tl.load(id_row + s // NSUB)
        key = (s % NSUB) * BK + offs_b  # the step's keys within the block
        page = tl.load(pt_row + blk).to(tl.int64)
        k = tl.load(KC + page * stride_kp + g * stride_kh + key[:, None] * stride_kb + offs_d[None, :])
        v = tl.load(VC + page * stride_vp + g * stride_vh + key[:, None] * stride_vb + offs_d[None, :])
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        qk = tl.dot(q, tl.trans(k)) * qk_scale
        visible = (blk * B + key <= pos)[None, :]
        m_i, l_i, acc = _online_update(qk, visible, m_i, l_i, acc, v)
    _store_out(OUT, LSE, out_rows, lse_rows, row_ok, offs_d, m_i, l_i, acc)


@triton.jit
def _token_list_kernel(Q, KC, VC, PT, CUQ, SEQ, TOK_REQ, RARE, OUT, LSE, RLIST, RCOUNT,
                       stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                       stride_pt, stride_ot, stride_oh, stride_rt, stride_rh, qk_scale,
                       HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
                       TOPK: tl.constexpr, UPCAST: tl.constexpr):
    """The rare-pair merge pass over the compact list of the (token, KV head) items that have rare
    blocks (written by the union kernel, ``RCOUNT`` of them), persistent: no program is spent on the
    items without any, which at rare_max 1 with regrouped tiles are ~3 of 4."""
    slots = tl.arange(0, TOPK)
    for i in range(tl.program_id(0), tl.load(RCOUNT), tl.num_programs(0)):
        item = tl.load(RLIST + i)
        t = item // HKV
        g = item % HKV
        req = tl.load(TOK_REQ + t)
        id_row = RARE + t.to(tl.int64) * stride_rt + g * stride_rh
        n_valid = tl.sum((tl.load(id_row + slots) >= 0).to(tl.int32), axis=0)
        _token_attend(Q, KC, VC, PT, CUQ, SEQ, OUT, LSE, t, g, req, id_row, n_valid, True,
                      stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                      stride_pt, stride_ot, stride_oh, qk_scale, HKV, G, GP, D, B, UPCAST)


@triton.jit
def _token_kernel(Q, KC, VC, PT, CUQ, SEQ, TOK_REQ, IDS, OUT, LSE, FLAG, RARE,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_it, stride_ih, stride_ot, stride_oh, stride_rt, stride_rh, qk_scale,
                  HKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, B: tl.constexpr,
                  TOPK: tl.constexpr, UPCAST: tl.constexpr, MERGE: tl.constexpr = False,
                  GATED: tl.constexpr = False, HAS_RARE: tl.constexpr = False, KN: tl.constexpr = 0):
    """``MERGE``: ``OUT``/``LSE`` already hold attention over other blocks (the tile kernel's common
    blocks); the token's ``IDS`` (its rare blocks) are added to that state; no ids: nothing written.
    ``GATED``: merge over ``RARE`` when ``FLAG`` is 1 (nothing to do without ``HAS_RARE``), plain
    attention over ``IDS`` when it is 0."""
    pid = tl.program_id(0)
    t = pid // HKV
    g = pid % HKV
    slots = tl.arange(0, TOPK)
    req = tl.load(TOK_REQ + t)  # independent of the loads below: one round trip for all of them
    if GATED:  # the flag and both id rows in one round trip, then the choice
        flag = tl.load(FLAG)
        ids_vals = tl.load(IDS + t.to(tl.int64) * stride_it + g * stride_ih + slots)
        if HAS_RARE:
            rare_vals = tl.load(RARE + t.to(tl.int64) * stride_rt + g * stride_rh + slots)
        else:
            rare_vals = tl.full([TOPK], -1, tl.int32)
        merge = flag != 0
        n_valid = tl.sum((tl.where(merge, rare_vals, ids_vals) >= 0).to(tl.int32), axis=0)
        if merge:
            id_row = RARE + t.to(tl.int64) * stride_rt + g * stride_rh
        else:
            id_row = IDS + t.to(tl.int64) * stride_it + g * stride_ih
    else:
        merge = MERGE
        id_row = IDS + t.to(tl.int64) * stride_it + g * stride_ih
        n_valid = tl.sum((tl.load(id_row + slots) >= 0).to(tl.int32), axis=0)
    if merge:
        if n_valid == 0:
            return
    _token_attend(Q, KC, VC, PT, CUQ, SEQ, OUT, LSE, t, g, req, id_row, n_valid, merge,
                  stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                  stride_pt, stride_ot, stride_oh, qk_scale, HKV, G, GP, D, B, UPCAST, KN)


@triton.jit
def _tile_block(s_raw, key0, bits, row_bit, pos, pos_min, offs_b, qk_scale, m_i, l_i, acc, v,
                BN: tl.constexpr, LAZY: tl.constexpr, EXP_FMA: tl.constexpr):
    """Online-softmax update of the tile state by ``BN`` keys of one union block (the first at position
    ``key0``) from their raw scores ``Q K^T``."""
    bias = tl.where(((bits >> row_bit) & 1) != 0, 0.0, float("-inf"))  # rows whose token chose it
    if key0 + (BN - 1) > pos_min:  # a key of this step lies past some row: causal mask
        s_raw = tl.where((key0 + offs_b)[None, :] <= pos[:, None], s_raw, float("-inf"))
    if EXP_FMA:  # scale > 0: the row max of the scaled scores is the scaled row max
        m_blk = tl.max(s_raw, axis=1) * qk_scale + bias
        s = s_raw
    else:
        s = s_raw * qk_scale + bias[:, None]
        m_blk = tl.max(s, axis=1)
    m_new = tl.maximum(m_i, m_blk)
    if LAZY:  # keep a stale reference unless some row's max grew by more than 2^8
        if tl.max((m_new > m_i + 8.0).to(tl.int32), axis=0) > 0:
            alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
    else:
        alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))  # 0 while m_i = -inf
        l_i = l_i * alpha
        acc = acc * alpha[:, None]
        m_i = m_new
    m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)
    if EXP_FMA:  # non-member rows: reference +inf, so exp2(. - inf) = 0
        p = tl.exp2(s * qk_scale - (m_ref - bias)[:, None])
    else:
        p = tl.exp2(s - m_ref[:, None])
    l_i = l_i + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_i, l_i, acc


@triton.jit
def _tile_kernel(Q, KC, VC, CUQ, SEQ, TILE_REQ, TILE_START, UNION, UPAGE, UMASK, UCOUNT, OUT, LSE, FLAG, TOKMAP,
                 PT, RARE, KDESC, VDESC, stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh,
                 stride_vb, stride_ot, stride_oh, stride_ut, stride_uh, stride_pt, stride_rt, stride_rh, qk_scale,
                 HKV: tl.constexpr, G: tl.constexpr, TQ: tl.constexpr, BLOCK_M: tl.constexpr,
                 D: tl.constexpr, B: tl.constexpr, UPCAST: tl.constexpr, HSPLIT: tl.constexpr = 1,
                 LAZY: tl.constexpr = False, EXP_FMA: tl.constexpr = False, GATED: tl.constexpr = False,
                 BN: tl.constexpr = 0, GROUPED: tl.constexpr = False, TAIL: tl.constexpr = False,
                 TOPK: tl.constexpr = 16, TMA: tl.constexpr = False, HEAD_MAJOR: tl.constexpr = False):
    """One program per (tile, KV head, head part): rows = ``TQ`` tokens x ``G / HSPLIT`` heads; each
    loop step takes ``BN`` keys of a union block (0: the whole block, ``B``). ``GROUPED``: the
    tile's tokens are ``TOKMAP[tile, g, :]`` (-1: empty slot) instead of ``t0 + j``. ``TAIL``
    (``HSPLIT`` 1): after its store the program adds its tokens' rare blocks (``RARE``, ``TOPK``
    slots per token) itself, token by token as the per-token merge pass would (same math, same
    rounding), meant to overlap that memory-bound work with the other program's MMAs on the SM
    (measured 3-7% slower: opt-in). ``TMA``:
    the union loop's K / V steps come through the tensor descriptors ``KDESC`` / ``VDESC`` over the
    contiguous caches seen as ``[pages * HKV * B, D]`` (row ``(page * HKV + g) * B + key``: the copy
    engine fills shared memory, no address registers) instead of pointer loads. ``HEAD_MAJOR``: the
    programs run KV head by KV head (all tiles of head 0 first), not tile by tile, so the programs in
    flight together read one head's pages for an ``HKV`` times longer stretch of tokens (measured no
    faster: opt-in)."""
    KN: tl.constexpr = B if BN == 0 else BN
    NSUB: tl.constexpr = B // KN
    GS: tl.constexpr = G // HSPLIT
    pid = tl.program_id(0)
    part = pid % HSPLIT
    if HEAD_MAJOR:
        n_tiles = tl.num_programs(0) // (HKV * HSPLIT)
        g = pid // (n_tiles * HSPLIT)
        tile = (pid // HSPLIT) % n_tiles
    else:
        tile = pid // (HKV * HSPLIT)
        g = (pid // HSPLIT) % HKV
    req = tl.load(TILE_REQ + tile)
    if GATED:  # loaded with the tile's request: no extra round trip
        req = tl.where(tl.load(FLAG) == 0, -1, req)
    if req < 0:
        return
    t0 = tl.load(TILE_START + tile)
    q_beg = tl.load(CUQ + req)
    q_end = tl.load(CUQ + req + 1)
    kv_len = tl.load(SEQ + req)

    rows = tl.arange(0, BLOCK_M)
    if GROUPED:
        tok = tl.load(TOKMAP + (tile * HKV + g).to(tl.int64) * TQ + rows // GS, mask=rows < TQ * GS, other=-1)
        row_ok = tok >= 0
        tok = tl.maximum(tok, 0)
    else:
        tok = t0 + rows // GS
        row_ok = (rows < TQ * GS) & (tok < q_end)
    head = g * G + part * GS + rows % GS
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    pos_min = tl.min(tl.where(row_ok, pos, 2147483647), axis=0)
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, KN)
    tok64 = tok.to(tl.int64)
    q = tl.load(Q + tok64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    row_bit = rows // GS  # the row's token within the tile: its bit in the block's token mask

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    u_off = tile.to(tl.int64) * stride_ut + g * stride_uh
    n_union = tl.load(UCOUNT + tile * HKV + g)
    for it in range(0, n_union * NSUB):
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
        m_i, l_i, acc = _tile_block(tl.dot(q, tl.trans(k)), blk * B + koff, bits, row_bit, pos, pos_min, offs_b,
                                    qk_scale, m_i, l_i, acc, v, KN, LAZY, EXP_FMA)
    _store_out(OUT, LSE, tok64 * stride_ot + head * stride_oh, tok64 * (HKV * G) + head,
               row_ok, offs_d, m_i, l_i, acc)
    if TAIL:
        tl.debug_barrier()  # the rows just stored are read back by other threads of this program
        slots = tl.arange(0, TOPK)
        for j in range(0, TQ):
            if GROUPED:
                t = tl.load(TOKMAP + (tile * HKV + g).to(tl.int64) * TQ + j)
            else:
                t = tl.where(t0 + j < q_end, t0 + j, -1)
            id_row = RARE + tl.maximum(t, 0).to(tl.int64) * stride_rt + g * stride_rh  # row 0 if no token
            n_valid = tl.where(t >= 0, tl.sum((tl.load(id_row + slots) >= 0).to(tl.int32), axis=0), 0)
            if n_valid > 0:
                _token_attend(Q, KC, VC, PT, CUQ, SEQ, OUT, LSE, t, g, req, id_row, n_valid, True,
                              stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                              stride_pt, stride_ot, stride_oh, qk_scale, HKV, G, 16, D, B, UPCAST, KN)


@triton.jit
def _rare_window_kernel(Q, KC, VC, PT, CUQ, SEQ, TOK_REQ, SORTED, SCOUNT, OUT, LSE, SCR_O, SCR_L, n_items,
                        stride_qt, stride_qh, stride_kp, stride_kh, stride_kb, stride_vp, stride_vh, stride_vb,
                        stride_pt, stride_ot, stride_oh, stride_sw, stride_sh, qk_scale,
                        HKV: tl.constexpr, G: tl.constexpr, CH: tl.constexpr, BLOCK_M: tl.constexpr,
                        D: tl.constexpr, B: tl.constexpr, WIN: tl.constexpr, UPCAST: tl.constexpr,
                        EXP_FMA: tl.constexpr, BN: tl.constexpr = 0):
    """Window merge pass of the rare pairs (``RARE_MAX``), persistent: each program takes (window of
    ``WIN`` packed tokens, KV head) items in turn and walks the item's rare pairs sorted by block
    (``_rare_sort_kernel``); each step takes the next up to ``CH`` tokens that chose the same block (of
    one request): rows = those tokens x the group's heads, the block's K/V loaded once for all of them.

    A token's state between its steps stays in fp32 in the program's own scratch (``SCR_O`` / ``SCR_L``,
    ``[WIN * G, D]`` / ``[WIN * G]``; LSE ``+inf`` = not touched yet, then read from the tile kernel's
    ``OUT`` / ``LSE``), so a token merged n times is rounded to the output dtype once, as in the
    per-token pass; the touched tokens are written out at the end of the item. A token appears at most
    once per step and a program's steps run in order (a barrier after each store): no merges race."""
    KN: tl.constexpr = B if BN == 0 else BN
    NSUB: tl.constexpr = B // KN
    pid = tl.program_id(0)
    scr_o = SCR_O + pid.to(tl.int64) * (WIN * G * D)
    scr_l = SCR_L + pid.to(tl.int64) * (WIN * G)
    rows = tl.arange(0, BLOCK_M)
    slot = rows // G
    offs_d = tl.arange(0, D)
    offs_b = tl.arange(0, KN)
    for item in range(pid, n_items, tl.num_programs(0)):
        w = item // HKV
        g = item % HKV
        n = tl.load(SCOUNT + item)
        base = SORTED + w.to(tl.int64) * stride_sw + g * stride_sh
        head = g * G + rows % G
        for c in range(0, WIN * G, BLOCK_M):  # nothing touched yet
            tl.store(scr_l + c + rows, float("inf"), mask=c + rows < WIN * G)
        tl.debug_barrier()
        i = 0
        while i < n:
            e0 = tl.load(base + i)
            blk = e0 // WIN
            req = tl.load(TOK_REQ + w * WIN + e0 % WIN)
            live = (slot < CH) & (i + slot < n)
            e = tl.load(base + i + slot, mask=live, other=0)
            tok = w * WIN + e % WIN
            member = live & (e // WIN == blk) & (tl.load(TOK_REQ + tok, mask=live, other=-1) == req)
            cnt = tl.sum(member.to(tl.int32), axis=0) // G  # members are a prefix: keys sorted by (block, token)
            q_beg = tl.load(CUQ + req)
            pos = tl.load(SEQ + req) - (tl.load(CUQ + req + 1) - q_beg) + (tok - q_beg)
            pos_min = tl.min(tl.where(member, pos, 2147483647), axis=0)
            tok64 = tok.to(tl.int64)
            q = tl.load(Q + tok64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                        mask=member[:, None], other=0.0)
            srow = (e % WIN) * G + rows % G  # the row's place in the scratch
            s_l = tl.load(scr_l + srow, mask=member, other=float("inf"))
            fresh = s_l == float("inf")
            g_l = tl.load(LSE + tok64 * (HKV * G) + head, mask=member & fresh, other=float("-inf"))
            lse_in = tl.where(fresh, g_l, s_l)
            m_i = lse_in * 1.4426950408889634  # normalised out with l = 1 at m = lse (base 2)
            l_i = tl.where(lse_in > float("-inf"), 1.0, 0.0)
            acc = tl.load(scr_o + srow[:, None] * D + offs_d[None, :], mask=(member & ~fresh)[:, None], other=0.0)
            acc += tl.load(OUT + tok64[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                           mask=(member & fresh)[:, None], other=0.0).to(tl.float32)  # disjoint masks
            if UPCAST:
                q = q.to(tl.float32)
            page = tl.load(PT + req.to(tl.int64) * stride_pt + blk).to(tl.int64)
            every = e0 * 0 - 1  # all membership bits set: every row here chose the block
            for sub in tl.static_range(NSUB):
                k = tl.load(KC + page * stride_kp + g * stride_kh + (sub * KN + offs_b)[:, None] * stride_kb
                            + offs_d[None, :])
                v = tl.load(VC + page * stride_vp + g * stride_vh + (sub * KN + offs_b)[:, None] * stride_vb
                            + offs_d[None, :])
                if UPCAST:
                    k = k.to(tl.float32)
                    v = v.to(tl.float32)
                m_i, l_i, acc = _tile_block(tl.dot(q, tl.trans(k)), blk * B + sub * KN, every, slot * 0, pos,
                                            pos_min, offs_b, qk_scale, m_i, l_i, acc, v, KN, False, EXP_FMA)
            _store_out(scr_o, scr_l, srow * D, srow, member, offs_d, m_i, l_i, acc)
            tl.debug_barrier()  # this step's stores before the next step's loads of the same tokens
            i += cnt
        for c in range(0, WIN * G, BLOCK_M):  # the touched tokens, rounded once
            r = c + rows
            tok64 = (w * WIN + r // G).to(tl.int64)
            hd = g * G + r % G
            s_l = tl.load(scr_l + r, mask=r < WIN * G, other=float("inf"))
            done = s_l != float("inf")
            o = tl.load(scr_o + r[:, None] * D + offs_d[None, :], mask=done[:, None], other=0.0)
            tl.store(OUT + tok64[:, None] * stride_ot + hd[:, None] * stride_oh + offs_d[None, :],
                     o.to(OUT.dtype.element_ty), mask=done[:, None])
            tl.store(LSE + tok64 * (HKV * G) + hd, s_l, mask=done)
        tl.debug_barrier()  # the next item reuses the scratch
