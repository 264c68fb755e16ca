"""Triton kernel that groups a window's tokens into tiles by shared selections (see ``grouping.py``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _popcount32(x):
    """Set bits of each int32 (SWAR; every mask has bit 31 clear, so the arithmetic shifts are safe)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 63


@triton.jit
def _hashed_bits(ids, NW: tl.constexpr):
    """``[N, NW]`` int32: row i has the one bit of block ``ids[i]``'s hash (none for ids < 0); the
    same multiplicative hash as ``grouping._hash_bits``."""
    h = (((ids.to(tl.int64) * 2654435761) >> 16) & (NW * 32 - 1)).to(tl.int32)
    words = tl.arange(0, NW)
    return tl.where(((h >> 5)[:, None] == words[None, :]) & (ids >= 0)[:, None], 1 << (h & 31)[:, None], 0)


@triton.jit
def _token_bits(IDS, t, stride_it, g, stride_ih, TOPK: tl.constexpr, NW: tl.constexpr):
    """The hashed block set of token ``t`` (``NW`` int32 words), from its ids (an L1/L2 hit)."""
    ids = tl.load(IDS + t.to(tl.int64) * stride_it + g * stride_ih + tl.arange(0, TOPK))
    return tl.reduce(_hashed_bits(ids, NW), 0, _or)


@triton.jit
def _group_kernel(IDS, CUQ, TILE_REQ, TILE_START, TOKMAP, stride_it, stride_ih, stride_mt, stride_mh,
                  HKV: tl.constexpr, TQ: tl.constexpr, NT: tl.constexpr, TOPK: tl.constexpr, NW: tl.constexpr):
    """One program per (tile, KV head); only a window's first tile (its ``NT`` tiles = ``NT * TQ``
    tokens of one request) does work. Each token's selected blocks hashed into an ``NW x 32``-bit
    set; greedy: the lowest unassigned token seeds a tile, then ``TQ - 1`` times the unassigned token
    with the most bits in common with the tile's union joins it (ties: the lower token)."""
    pid = tl.program_id(0)
    tile = pid // HKV
    g = pid % HKV
    req = tl.load(TILE_REQ + tile)
    if req < 0:
        return
    t0 = tl.load(TILE_START + tile)
    q_beg = tl.load(CUQ + req)
    q_end = tl.load(CUQ + req + 1)
    if ((t0 - q_beg) // TQ) % NT != 0:
        return
    W: tl.constexpr = NT * TQ
    idx = tl.arange(0, W)
    tok = t0 + idx
    ok = tok < q_end
    bm = tl.zeros([W, NW], tl.int32)
    for a in tl.static_range(TOPK):  # one id column at a time: [W, NW] live, no [W, TOPK, NW]
        col = tl.load(IDS + tok.to(tl.int64) * stride_it + g * stride_ih + a, mask=ok, other=-1)
        bm = bm | _hashed_bits(col, NW)
    taken = ~ok
    n_tiles = (tl.sum(ok.to(tl.int32), axis=0) + TQ - 1) // TQ
    for grp in range(0, n_tiles):
        out_row = TOKMAP + (tile + grp).to(tl.int64) * stride_mt + g * stride_mh
        seed = tl.min(tl.where(taken, W, idx), axis=0)
        union = _token_bits(IDS, t0 + seed, stride_it, g, stride_ih, TOPK, NW)  # [NW]
        taken = taken | (idx == seed)
        tl.store(out_row, t0 + seed)
        for s in range(1, TQ):
            score = tl.sum(_popcount32(bm & union[None, :]), axis=1)
            score = tl.where(taken, -1, score)
            best = tl.argmax(score, axis=0, tie_break_left=True)
            has = tl.max(score, axis=0) >= 0
            union = union | _token_bits(IDS, t0 + best, stride_it, g, stride_ih, TOPK, NW)
            taken = taken | ((idx == best) & has)
            tl.store(out_row + s, tl.where(has, t0 + best, -1))
