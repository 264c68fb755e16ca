"""Triton kernel that builds the union of a tile's selected blocks (see ``unions.py``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_token(TOKMAP, tile, g, j, t0, q_end, HKV: tl.constexpr, TQ: tl.constexpr, GROUPED: tl.constexpr):
    """The tile's ``j``-th token (scalar or vector ``j``) and whether it exists: ``TOKMAP[tile, g, j]``
    when regrouped (-1: none), else ``t0 + j`` inside the request. The token is clamped to >= 0."""
    if GROUPED:
        tok = tl.load(TOKMAP + (tile * HKV + g).to(tl.int64) * TQ + j)
        ok = tok >= 0
    else:
        tok = t0 + j
        ok = tok < q_end
    return tl.maximum(tok, 0), ok


@triton.jit
def _union_kernel(IDS, PT, CUQ, TILE_REQ, TILE_START, UNION, UPAGE, UMASK, UCOUNT, RARE, TOKMAP,
                  stride_it, stride_ih, stride_pt, stride_ut, stride_uh, stride_rt, stride_rh,
                  HKV: tl.constexpr, TQ: tl.constexpr, TOPK: tl.constexpr, RARE_MAX: tl.constexpr,
                  GROUPED: tl.constexpr = False):
    """Union of the selected blocks of one (tile, KV head), de-duplicated and compacted in order of
    first appearance (token by token), with the physical page of each block and the bitmask of the
    tile's tokens that selected it (int32, bit j = token t0 + j, TQ <= 32); -1 after ``count``.

    ``RARE_MAX > 0``: blocks selected by at most ``RARE_MAX`` of the tile's tokens stay out of the
    union; each token's such blocks go to ``RARE [T, Hkv, TOPK]`` instead (compacted, -1 after).
    ``GROUPED``: the tile's j-th token is ``TOKMAP[tile, g, j]`` (-1: none), not ``t0 + j``.
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
    tok, ok = _tile_token(TOKMAP, tile, g, tok_of, t0, q_end, HKV, TQ, GROUPED)
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
            tj, ok_j = _tile_token(TOKMAP, tile, g, jt, t0, q_end, HKV, TQ, GROUPED)
            row = tl.load(IDS + tj.to(tl.int64) * stride_it + g * stride_ih + slots,
                          mask=(slots * 0 + ok_j.to(tl.int32)) > 0, other=-2)
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
        tok2, ok2 = _tile_token(TOKMAP, tile, g, tl.arange(0, TQ), t0, q_end, HKV, TQ, GROUPED)
        tok_ok = ok2[:, None]
        r_base = RARE + tok2.to(tl.int64)[:, None] * stride_rt + g * stride_rh
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
