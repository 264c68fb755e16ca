"""Tiles of tokens that chose similar blocks: each window of ``16 x tile_q`` tokens of a request is
regrouped into its 16 tiles so that a tile's tokens share more of their selections (fewer union
blocks, fewer idle MMA rows, fewer rare pairs). Any regrouping is exact: a tile's rows only need
their own token's position and ids. The Triton builder and its python reference (same algorithm,
same hash, same tie-breaks, so the tests compare them exactly)."""
from __future__ import annotations

import torch

WINDOW_TILES = 16  # tiles per regrouped window: 128 tokens = one 128-key block at 8-token tiles
HASH_WORDS = 4  # a token's blocks hashed into 4 x 32 bits (8 or 16 words: the same unions, slower)


def group_tiles(topk_ids: torch.Tensor, cu_seqlens_q: torch.Tensor, tile_req: torch.Tensor, tile_start: torch.Tensor,
                tile_q: int, num_warps: int = 2, words: int = HASH_WORDS, window: int = WINDOW_TILES) -> torch.Tensor:
    """int32 ``[tiles, Hkv, tile_q]``: the tokens of each (tile, KV head), -1 for empty slots.

    One Triton launch, no host sync; ``tile_req`` / ``tile_start`` from ``tile_table(...,
    longest_first=False)`` (a request's tiles adjacent, in order). One program per window runs the
    greedy (a chain of 128 dependent picks) of every KV head side by side, on 2 warps (measured
    fastest on the H200, M3 shape: 0.31 ms at 64K, 0.58 at 128K). ``words``: 32-bit words of the
    hashed block sets; ``window``: tiles per regrouped window (powers of two)."""
    import triton

    from kernels.sparse_prefill.triton_grouping import _group_kernel

    t, hkv, k = topk_ids.shape
    n_tiles = tile_req.shape[0]
    tokmap = torch.full((n_tiles, hkv, tile_q), -1, dtype=torch.int32, device=topk_ids.device)
    _group_kernel[(n_tiles,)](topk_ids, cu_seqlens_q, tile_req, tile_start, tokmap,
                              topk_ids.stride(0), topk_ids.stride(1), tokmap.stride(0), tokmap.stride(1),
                              HKV=hkv, HP=triton.next_power_of_2(hkv), TQ=tile_q, NT=window, TOPK=k, NW=words,
                              num_warps=num_warps)
    return tokmap


def _hash_bits(ids: list[int], words: int) -> int:
    bits = 0
    for b in ids:
        if b >= 0:
            bits |= 1 << (((b * 2654435761) >> 16) & (words * 32 - 1))
    return bits


def group_tiles_reference(topk_ids: torch.Tensor, cu_seqlens_q: torch.Tensor, tile_q: int,
                          words: int = HASH_WORDS, window: int = WINDOW_TILES) -> torch.Tensor:
    """Python reference of ``group_tiles`` over the tile table of ``tile_table(longest_first=False)``."""
    from kernels._common.tiles import tile_table

    t, hkv, _ = topk_ids.shape
    tile_req, tile_start = tile_table(cu_seqlens_q, t, tile_q, longest_first=False)
    tile_req, tile_start, cu = tile_req.tolist(), tile_start.tolist(), cu_seqlens_q.tolist()
    ids = topk_ids.cpu().tolist()
    tokmap = torch.full((len(tile_req), hkv, tile_q), -1, dtype=torch.int32)
    for tile, (req, t0) in enumerate(zip(tile_req, tile_start, strict=True)):
        if req < 0 or ((t0 - cu[req]) // tile_q) % window:
            continue
        toks = list(range(t0, min(cu[req + 1], t0 + window * tile_q)))
        for g in range(hkv):
            bits = [_hash_bits(ids[x][g], words) for x in toks]
            left = set(range(len(toks)))
            for grp in range(-(-len(toks) // tile_q)):
                seed = min(left)
                left.remove(seed)
                union, members = bits[seed], [seed]
                while len(members) < tile_q and left:
                    best = max(left, key=lambda i: (bin(bits[i] & union).count("1"), -i))
                    left.remove(best)
                    union |= bits[best]
                    members.append(best)
                tokmap[tile + grp, g, :len(members)] = torch.tensor([toks[i] for i in members], dtype=torch.int32)
    return tokmap.to(topk_ids.device)
