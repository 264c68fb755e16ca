"""Triton kernel that groups a window's tokens into tiles by shared selections (see ``grouping.py``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _popcount32(x):
    """Set bits of each int32 (SWAR; every mask has bit 31 clear, so the arithmetic shifts are safe)."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) >> 24) & 63


@triton.jit
def _hashed_bits(ids, NW: tl.constexpr):
    """``[A, B, NW]`` int32 from ``ids [A, B]``: the one bit of each block's hash (none for ids < 0);
    the same multiplicative hash as ``grouping._hash_bits``."""
    # bits 16.. of the 64-bit product are those of the 32-bit one (the low bits of a product only
    # depend on the factors' low bits): uint32 arithmetic, no int64 registers
    h = (((ids.to(tl.uint32) * 2654435761) >> 16) & (NW * 32 - 1)).to(tl.int32)
    words = tl.arange(0, NW)
    return tl.where(((h >> 5)[:, :, None] == words[None, None, :]) & (ids >= 0)[:, :, None],
                    1 << (h & 31)[:, :, None], 0)


@triton.jit
def _group_kernel(IDS, CUQ, TILE_REQ, TILE_START, TOKMAP, stride_it, stride_ih, stride_mt, stride_mh,
                  HKV: tl.constexpr, HP: tl.constexpr, TQ: tl.constexpr, NT: tl.constexpr, TOPK: tl.constexpr,
                  NW: tl.constexpr):
    """One program per tile; only a window's first tile (its ``NT`` tiles = ``NT * TQ`` tokens of one
    request) does work, for all ``HKV`` KV heads at once (``HP``: HKV padded to a power of two): the
    heads' greedy chains are independent, so running them side by side in one program hides each
    pick's latency (a chain of reductions) behind the other heads' picks. Each token's selected
    blocks hashed into an ``NW x 32``-bit set; greedy: the lowest unassigned token seeds a tile, then
    ``TQ - 1`` times the unassigned token with the most bits in common with the tile's union joins
    it (ties: the lower token)."""
    tile = tl.program_id(0)
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
    heads = tl.arange(0, HP)
    live = heads < HKV
    ok = (t0 + idx < q_end)[None, :] & live[:, None]  # [HP, W]
    tok64 = (t0 + idx).to(tl.int64)
    bm = tl.zeros([HP, W, NW], tl.int32)
    for a in range(TOPK):  # one id column at a time (not unrolled: the loads are not all hoisted)
        col = tl.load(IDS + tok64[None, :] * stride_it + heads[:, None] * stride_ih + a, mask=ok, other=-1)
        bm = bm | _hashed_bits(col, NW)
    taken = ~ok
    n_tiles = (tl.minimum(q_end - t0, W) + TQ - 1) // TQ
    for grp in range(n_tiles):
        out_row = TOKMAP + (tile + grp).to(tl.int64) * stride_mt + heads * stride_mh  # [HP]
        seed = tl.min(tl.where(taken, W, idx[None, :]), axis=1)  # [HP]; W for the padded heads
        pick = idx[None, :] == seed[:, None]
        union = tl.sum(tl.where(pick[:, :, None], bm, 0), axis=1)  # [HP, NW]: the one picked row
        taken = taken | pick
        tl.store(out_row, t0 + seed, mask=live)
        for s in range(1, TQ):
            score = tl.sum(_popcount32(bm & union[:, None, :]), axis=2)  # [HP, W]
            score = tl.where(taken, -1, score)
            best = tl.argmax(score, axis=1, tie_break_left=True)
            has = tl.max(score, axis=1) >= 0
            pick = (idx[None, :] == best[:, None]) & has[:, None]
            union = union | tl.sum(tl.where(pick[:, :, None], bm, 0), axis=1)
            taken = taken | pick
            tl.store(out_row + s, tl.where(has, t0 + best, -1), mask=live)
