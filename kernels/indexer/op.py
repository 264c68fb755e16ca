"""Public MSA indexer op over the paged index-key cache: validation and dispatch."""
from __future__ import annotations

import math
from typing import Literal

import torch

from kernels._common.tiles import tile_table, token_requests
from kernels._common.validate import (check_choice, check_lengths, check_size, check_tensor,
                                      interpreting, resolve_impl)
from kernels.indexer import naive

OP = "msa_indexer"
TOPK_CHOICES = (4, 8, 16, 32)
BLOCK_CHOICES = (64, 128)
HEAD_DIM_CHOICES = (16, 32, 64, 128, 256)
_TILE_ROWS = 128  # MMA rows per program: tokens x index heads


def _validate(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, topk, impl, lengths=True):
    check_tensor(OP, "q_idx", q_idx, ndim=3, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    impl = resolve_impl(impl, q_idx.device, OP)
    if impl == "triton" and q_idx.dtype == torch.float32:
        raise ValueError(f"{OP}: the Triton indexer takes bfloat16 or float16 q_idx, got float32; "
                         "use impl='torch' for fp32")
    dev = q_idx.device
    check_tensor(OP, "k_idx_cache", k_idx_cache, ndim=3, dtypes=(q_idx.dtype,), device=dev)
    check_tensor(OP, "page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "seq_lens_kv", seq_lens_kv, ndim=1, dtypes=(torch.int32,), device=dev)
    t, h, d = q_idx.shape
    check_size(OP, "k_idx_cache", k_idx_cache.shape[2], d, "last dim (d_idx of q_idx)")
    check_choice(OP, "k_idx_cache block size (dim 1)", k_idx_cache.shape[1], BLOCK_CHOICES)
    check_choice(OP, "d_idx", d, HEAD_DIM_CHOICES)
    check_choice(OP, "topk", topk, TOPK_CHOICES)
    if not 1 <= h <= 16:
        raise ValueError(f"{OP}: q_idx must have 1..16 index heads (one per KV group), got {h}")
    check_lengths(OP, cu_seqlens_q, seq_lens_kv, t, page_table, k_idx_cache.shape[1], values=lengths or impl == "torch")
    return impl


def msa_indexer(q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor,
                cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, topk: int, *,
                return_lse: bool = False, impl: Literal["auto", "triton", "torch"] = "auto",
                check_lengths: bool = True):
    """Select the top-k blocks per (query token, index head).

    q_idx ``[T, H, d_idx]`` (H = KV heads, one index head per group), k_idx_cache ``[pages, B, d_idx]``,
    page_table int32 ``[R, max_pages]``, cu_seqlens_q int32 ``[R+1]``, seq_lens_kv int32 ``[R]``
    (total KV length including this chunk). Returns int32 ``[T, H, topk]`` logical block ids
    (score-descending history, ties to the smaller id, own block in the last valid slot, -1 padding),
    and with ``return_lse`` also the fp32 ``[T, H]`` natural-log LSE of the scores over the selected
    tokens. Scores are ``q.k / sqrt(d_idx)`` in fp32. ``check_lengths=False`` skips the host-side
    check of the length values (its one host sync; shapes are still checked), for the engine.
    """
    impl = _validate(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, topk, impl, check_lengths)
    if impl == "torch":
        return naive.indexer_paged_reference(q_idx, k_idx_cache, page_table, cu_seqlens_q,
                                             seq_lens_kv, topk, return_lse=return_lse)
    ids = _launch_indexer(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, topk, mode=0)
    if not return_lse:
        return ids
    return ids, _launch_selected_lse(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, ids)


def indexer_block_scores_triton(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv):
    """Block scores of the history blocks ``[T, H, max_pages]`` fp32 (-inf elsewhere, own block too),
    computed by the same kernel (``MODE 1``): the input of the ``torch.topk`` baseline."""
    return _launch_indexer(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, 4, mode=1)


def indexer_scores_only_triton(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv):
    """Scoring and block max with the top-k stage left out (``MODE 2``): for timing the top-k stage."""
    return _launch_indexer(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, 4, mode=2)


def default_pages_per_iter(block: int) -> int:
    """Key pages per loop iteration (two independent top-k tables at 2): see ``_launch_indexer``."""
    return 1


def _launch_indexer(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, topk, mode,
                    skip_unchanged=False, num_warps=8, num_stages=3, tile_rows=_TILE_ROWS, pages_per_iter=None):
    from kernels.indexer.triton_indexer import _indexer_fwd_kernel

    t, h, d = q_idx.shape
    block = k_idx_cache.shape[1]
    dev = q_idx.device
    tq = tile_rows // h
    tile_req, tile_start = tile_table(cu_seqlens_q, t, tq)
    ids = torch.full((t, h, topk), -7, dtype=torch.int32, device=dev)  # poison: every slot is written
    scores = aux = ids
    if mode == 1:
        scores = torch.full((t, h, page_table.shape[1]), float("-inf"), device=dev)
    if mode == 2:
        aux = torch.empty((t, h), dtype=torch.float32, device=dev)
    if t == 0:
        return {0: ids, 1: scores, 2: aux}[mode]
    _indexer_fwd_kernel[(tile_req.shape[0],)](
        q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, tile_req, tile_start, ids, scores, aux,
        q_idx.stride(0), q_idx.stride(1), k_idx_cache.stride(0), k_idx_cache.stride(1), page_table.stride(0),
        ids.stride(0), ids.stride(1), scores.stride(0) if mode == 1 else 0, scores.stride(1) if mode == 1 else 0,
        1.0 / math.sqrt(d), H=h, D=d, B=block, TOPK=topk, TQ=tq, BLOCK_M=tile_rows, MODE=mode,
        UPCAST=interpreting(), SKIP_UNCHANGED=skip_unchanged,
        PAGES=pages_per_iter or default_pages_per_iter(block), num_warps=num_warps, num_stages=num_stages)
    return {0: ids, 1: scores, 2: aux}[mode]


def _launch_selected_lse(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, ids):
    from kernels.indexer.triton_indexer import _selected_lse_kernel

    t, h, d = q_idx.shape
    lse = torch.full((t, h), float("nan"), dtype=torch.float32, device=q_idx.device)
    if t == 0:
        return lse
    tok_req = token_requests(cu_seqlens_q, t)
    _selected_lse_kernel[(t * h,)](
        q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, tok_req, ids, lse,
        q_idx.stride(0), q_idx.stride(1), k_idx_cache.stride(0), k_idx_cache.stride(1), page_table.stride(0),
        ids.stride(0), ids.stride(1), 1.0 / math.sqrt(d),
        H=h, D=d, B=k_idx_cache.shape[1], TOPK=ids.shape[2], num_warps=4)
    return lse
