"""The MSA prefill indexer on the CPU: the reference's selection (`kernels.indexer.naive`), scoring only
the candidate blocks.

Queries are taken in tiles that share their own block `L` (the queries of one block of positions), so
every query of a tile has the same candidates, the blocks `b < L`, all fully visible: one matmul of
the tile's index queries against the keys `[0, L*B)`, the max over each block, then the reference's
rule (`select_blocks`: the top `k - 1` candidates, descending, ties to the smaller id, then `L`). The
own block's score and the blocks after it never enter the selection, so they are not computed: the
work is the causal triangle, not the rectangle, and there is no `-inf` masking pass. Same block scores
as the reference (fp32, the same product; the scale applied after the block max, which rounding, being
monotonic, leaves bit for bit the same), so the same ids. int8 index keys (an FP8 cache's) are dequantised
as gathered and scored with the int8-rounded queries, as the reference does.
"""
from __future__ import annotations

import math

import torch

from engine.attention.meta import AttentionMeta
from kernels.indexer.naive import scored_queries, select_blocks


def block_tiles(q_len: int, kv_len: int, block: int) -> list[tuple[int, int, int]]:
    """The query tiles of one request: `(first, end, own_block)` per block of positions its queries
    cover (query i sits at position `kv_len - q_len + i`)."""
    start = kv_len - q_len
    tiles = []
    a = 0
    while a < q_len:
        own = (start + a) // block
        b = min(q_len, (own + 1) * block - start)
        tiles.append((a, b, own))
        a = b
    return tiles


def prefill_block_ids(q_idx: torch.Tensor, k_idx_cache: torch.Tensor, meta: AttentionMeta,
                      topk: int, k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q_idx `[T, H, d_idx]`, k_idx_cache `[pages, B, d_idx]` (int8: with its fp32 `k_idx_scale [pages, B]`)
    -> int32 logical block ids `[T, H, topk]` (the reference's layout: history blocks by score, descending;
    the own block next; -1 padding)."""
    t_total, heads, d_idx = q_idx.shape
    block = k_idx_cache.shape[1]
    scale = 1.0 / math.sqrt(d_idx)
    out = torch.empty((t_total, heads, topk), dtype=torch.int32, device=q_idx.device)
    start = 0
    for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
        pages = torch.as_tensor(meta.page_lists[r][:-(-kl // block)], device=k_idx_cache.device)
        keys = k_idx_cache.index_select(0, pages).float()
        if k_idx_scale is not None:
            keys = keys * k_idx_scale.index_select(0, pages)[..., None]
        keys = keys.reshape(-1, d_idx)  # [n_blocks * B, d_idx]
        qr = scored_queries(q_idx[start:start + ql], k_idx_cache.dtype, False).float()
        for a, b, own in block_tiles(ql, kl, block):
            qt = qr[a:b]
            scores = qt.reshape(-1, d_idx) @ keys[:own * block].T  # [tq * H, own * B]
            # scaled after the max: rounding is monotonic, so these are the reference's block scores, bit for bit
            blocks = scores.view(b - a, heads, own, block).amax(dim=-1) * scale
            local = torch.full((b - a,), own, dtype=torch.long, device=q_idx.device)
            out[start + a:start + b] = select_blocks(blocks, local, topk)
        start += ql
    return out
