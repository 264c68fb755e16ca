"""Rare pairs bucketed into items that share K / V: the launcher of the two Triton passes and its reference.

The tile kernel leaves each tile's rare blocks (chosen by at most ``rare_max`` of its tokens) to a second
pass. The per-token pass reads a rare block's K / V once per token that chose it; here the pairs are
bucketed by (round, KV head, request, block) instead, where round ``j`` holds each token's ``j``-th rare
block, and each bucket is cut into items of up to ``tile_q`` tokens: the Gluon kernel's rare mode
(``gluon_tile.launch_gluon_rare``) reads an item's K / V once for all its tokens and merges the result
into their output, one launch per round, so that no token is in two items that run at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._common.tiles import token_requests


@dataclass
class RareItems:
    """Items of rare pairs: ``tok`` int32 ``[n_max, tile_q]`` (tokens, -1 after), ``g`` / ``req`` /
    ``blk`` / ``page`` int32 ``[n_max]`` (KV head, request, logical block, physical page), and
    ``round_start`` int32 ``[rounds + 1]``: round ``j``'s items are ``round_start[j] ..
    round_start[j + 1]``. Rows past ``round_start[-1]`` are unused (``n_max`` bounds the count
    without a host sync)."""
    tok: torch.Tensor
    g: torch.Tensor
    req: torch.Tensor
    blk: torch.Tensor
    page: torch.Tensor
    round_start: torch.Tensor


def max_rare_items(t: int, hkv: int, topk: int, pages: int, tile_q: int) -> int:
    """An upper bound of the item count: ``ceil(n / tile_q)`` per bucket of ``n`` pairs is at most
    ``pairs / tile_q + buckets``, with ``pairs <= T * Hkv * k`` and non-empty buckets at most
    ``min(pairs, rounds * Hkv * pages)``."""
    pairs = t * hkv * topk
    return max(1, min(pairs, -(-pairs // tile_q) + topk * hkv * pages))


def build_rare_items(rare_ids: torch.Tensor, page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     tile_q: int) -> RareItems:
    """Bucket the pairs of ``rare_ids`` (int32 ``[T, Hkv, k]``, each row's valid prefix then -1) into
    items; two Triton passes (count, then scatter by atomic slots) and a prefix sum, no host sync.
    Which tokens share an item depends on the atomics' order; each token's result does not."""
    from kernels.sparse_prefill.triton_rare_items import _rare_count_kernel, _rare_scatter_kernel

    t, hkv, topk = rare_ids.shape
    n_req, max_pages = page_table.shape
    dev = rare_ids.device
    n_buckets = topk * hkv * n_req * max_pages
    if n_buckets >= 2 ** 31:  # the bucket index is int32
        raise ValueError(f"msa_prefill_attention: rare_pass='items' buckets k x Hkv x requests x pages = {n_buckets} "
                         f"ways, over int32; use rare_pass='token' or fewer requests per launch")
    tok_req = token_requests(cu_seqlens_q, t)
    count = torch.zeros(n_buckets, dtype=torch.int32, device=dev)
    bt = 64
    grid = (max(1, -(-t // bt)), hkv)
    meta = dict(HKV=hkv, R=n_req, P=max_pages, TOPK=topk, BT=bt)
    _rare_count_kernel[grid](rare_ids, tok_req, count, t, rare_ids.stride(0), rare_ids.stride(1), **meta)
    per_bucket = (count + tile_q - 1) // tile_q
    item_off = torch.zeros(n_buckets + 1, dtype=torch.int32, device=dev)
    item_off[1:] = torch.cumsum(per_bucket, 0)
    round_start = item_off[::hkv * n_req * max_pages].contiguous()  # buckets are round-major; the last is the end
    n_max = max_rare_items(t, hkv, topk, n_req * max_pages, tile_q)
    items = RareItems(torch.full((n_max, tile_q), -1, dtype=torch.int32, device=dev),
                      *(torch.zeros(n_max, dtype=torch.int32, device=dev) for _ in range(4)), round_start)
    fill = torch.zeros(n_buckets, dtype=torch.int32, device=dev)
    _rare_scatter_kernel[grid](rare_ids, tok_req, page_table, fill, item_off, items.tok, items.g, items.req, items.blk,
                               items.page, t, rare_ids.stride(0), rare_ids.stride(1), page_table.stride(0), TQ=tile_q,
                               **meta)
    return items


def rare_items_reference(rare_ids: torch.Tensor, cu_seqlens_q: torch.Tensor, tile_q: int) -> list:
    """The buckets in item order: ``(round, g, req, blk, sorted tokens, items)`` per non-empty bucket
    (plain Python; what ``build_rare_items``' items must add up to)."""
    t, hkv, topk = rare_ids.shape
    req_of = token_requests(cu_seqlens_q, t).tolist()
    buckets: dict = {}
    ids = rare_ids.tolist()
    for tok in range(t):
        for g in range(hkv):
            for j, blk in enumerate(ids[tok][g]):
                if blk >= 0:
                    buckets.setdefault((j, g, req_of[tok], blk), []).append(tok)
    return [(j, g, r, b, sorted(toks), -(-len(toks) // tile_q)) for (j, g, r, b), toks in sorted(buckets.items())]
