"""`--attention msa-oracle`: MSA's block budget with the best possible choice. For each query token and KV
group the oracle keeps the blocks that hold the most of the group's true attention mass (the dense softmax
of every query head of the group, summed over the heads, computed exactly in fp32), by the indexer's own
rule (`kernels.indexer.naive.select_blocks`: the top `k - 1` earlier blocks, then the query's own block),
then attends over them exactly like `msa`. Its gap to dense is the cost of block sparsity; the gap between
`msa` and `msa-oracle` is the cost of the indexer.

The masses come from dense attention scores (`engine.msa.recall.dense_probs`), one request at a time,
queries in chunks: O(context^2) work, like dense attention itself, and not capturable in a CUDA graph. The
requests of a step with one query each (decode tokens, also beside prompt chunks in a mixed step) are scored at
once over their pages (`_decode_ids`): a loop over 64 requests x 30 layers per step made the arm several times
slower than the attention it measures.
"""
from __future__ import annotations

import torch

from engine.attention.dense import gather_kv
from engine.attention.meta import AttentionMeta
from engine.attention.msa import CpuMaskedMSA, MSAAttention
from engine.msa.recall import chunk_elements, decode_step_probs, dense_probs, single_query_rows


def oracle_ids(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMeta, topk: int, scale: float) -> torch.Tensor:
    """q `[T, Hq, d]`, k_cache `[pages, Hkv, B, d]` -> int32 ids `[T, Hkv, topk]` (the indexer's layout: history
    blocks by mass, descending, ties to the smaller id; the own block in the last valid slot; -1 padding)."""
    from kernels.indexer.naive import select_blocks

    hq, hkv, block = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    limit = chunk_elements(q.device)
    one = single_query_rows(meta)
    if one is not None and one.every:  # a decode step: every request scored at once
        return _decode_ids(q, k_cache, one.kv_lens, one.page_table, topk, scale, limit)
    out = torch.full((q.shape[0], hkv, topk), -1, dtype=torch.int32, device=q.device)
    if one is not None:  # the decode tokens of a mixed step, at once; the prompt chunks below one at a time
        out[one.at] = _decode_ids(q[one.at], k_cache, one.kv_lens, one.page_table, topk, scale, limit)
    batched = set(one.reqs) if one is not None else set()
    start = 0
    for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
        if r in batched:
            start += ql
            continue
        k = gather_kv(k_cache, meta.page_lists[r], kl)  # [Hkv, S, d]
        nb = -(-kl // block)
        chunk = max(1, limit // (hq * kl))
        for c0 in range(0, ql, chunk):
            c1 = min(ql, c0 + chunk)
            pos = kl - ql + torch.arange(c0, c1, device=q.device)
            p = dense_probs(q[start + c0:start + c1], k, pos, scale)  # [Tc, Hq, S]
            mass = p.view(c1 - c0, hkv, hq // hkv, kl).sum(2)
            mass = torch.nn.functional.pad(mass, (0, nb * block - kl)).view(c1 - c0, hkv, nb, block).sum(-1)
            out[start + c0:start + c1] = select_blocks(mass, pos // block, topk)
        start += ql
    return out


def _decode_ids(q: torch.Tensor, k_cache: torch.Tensor, kv_lens: list[int], page_table: torch.Tensor, topk: int,
                scale: float, limit: int) -> torch.Tensor:
    """`oracle_ids` of requests with one query each (q `[R, Hq, d]`, their lengths and page-table rows): every
    request scored at once (`decode_step_probs`)."""
    from kernels.indexer.naive import select_blocks

    hq, hkv, block = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    out = []
    for r0, r1, pos, p in decode_step_probs(q, k_cache, kv_lens, page_table, scale, limit):
        mass = p.view(r1 - r0, hkv, hq // hkv, -1).sum(2).view(r1 - r0, hkv, -1, block).sum(-1)
        out.append(select_blocks(mass, pos // block, topk))
    return torch.cat(out)


class _OracleSelection:
    """Replaces the indexer's choice with the oracle's (the attention stays the base class's)."""

    msa: object
    scale: float
    selects_by_keys = True  # an FP8 cache: MSAAttention hands `_select` the pages in use dequantised

    def _select(self, q, q_idx, k_cache, kic, meta: AttentionMeta, kis: torch.Tensor | None) -> torch.Tensor:
        return oracle_ids(q, k_cache, meta, self.msa.topk, self.scale)  # type: ignore[attr-defined]


class OracleMSA(_OracleSelection, CpuMaskedMSA):
    """`msa-oracle` on the CPU: oracle selection, the block-sparse CPU attention (`msa_cpu`) over it."""


class GpuOracleMSA(_OracleSelection, MSAAttention):
    """`msa-oracle` on a GPU: oracle selection (torch, exact), the Triton sparse attention over it."""
