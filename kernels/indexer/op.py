"""Public MSA indexer op over the paged index-key cache: validate, plan, launch."""
from __future__ import annotations

import math
from typing import Literal

import torch

from kernels._common.fp8 import FP8
from kernels._common.tiles import tile_table, token_requests
from kernels._common.validate import (
    SCALED_INDEX_KEYS,
    check_choice,
    check_index_scale,
    check_lengths,
    check_size,
    check_tensor,
)

from . import naive
from .plan import OP, IndexerPlan, plan_indexer

TOPK_CHOICES = (4, 8, 16, 32)
BLOCK_CHOICES = (64, 128)
HEAD_DIM_CHOICES = (16, 32, 64, 128, 256)


def _validate(q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, topk, k_idx_scale=None) -> None:
    check_tensor(OP, "q_idx", q_idx, ndim=3, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    dev = q_idx.device
    check_tensor(OP, "k_idx_cache", k_idx_cache, ndim=3, dtypes=(q_idx.dtype, *SCALED_INDEX_KEYS), device=dev)
    check_index_scale(OP, k_idx_cache, k_idx_scale)
    check_tensor(OP, "page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "seq_lens_kv", seq_lens_kv, ndim=1, dtypes=(torch.int32,), device=dev)
    _, h, d = q_idx.shape
    check_size(OP, "k_idx_cache", k_idx_cache.shape[2], d, "last dim (d_idx of q_idx)")
    check_choice(OP, "k_idx_cache block size (dim 1)", k_idx_cache.shape[1], BLOCK_CHOICES)
    check_choice(OP, "d_idx", d, HEAD_DIM_CHOICES)
    check_choice(OP, "topk", topk, TOPK_CHOICES)
    if not 1 <= h <= 16:
        raise ValueError(f"{OP}: q_idx must have 1..16 index heads (one per KV group), got {h}")


def msa_indexer(q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor,
                cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, topk: int, *,
                return_lse: bool = False, impl: Literal["auto", "triton", "torch"] = "auto",
                check_lengths: bool = True, k_idx_scale: torch.Tensor | None = None, index_fp8_dot: bool = False):
    """Select the top-k blocks per (query token, index head).

    q_idx ``[T, H, d_idx]`` (H = KV heads, one index head per group), k_idx_cache ``[pages, B, d_idx]``,
    page_table int32 ``[R, max_pages]``, cu_seqlens_q int32 ``[R+1]``, seq_lens_kv int32 ``[R]``
    (total KV length including this chunk). Returns int32 ``[T, H, topk]`` logical block ids
    (score-descending history, ties to the smaller id, own block in the last valid slot, -1 padding),
    and with ``return_lse`` also the fp32 ``[T, H]`` natural-log LSE of the scores over the selected
    tokens. Scores are ``q.k / sqrt(d_idx)`` in fp32. ``check_lengths=False`` skips the host-side
    check of the length values (its one host sync; shapes are still checked), for the engine.

    FP8 index keys: k_idx_cache float8_e4m3fn with fp32 ``k_idx_scale [pages, B]`` (one scale per token,
    ``kernels.decode.quantize_index_keys``); a key stands for ``k8 * scale``. ``index_fp8_dot=True`` also
    rounds each (token, head) row of q_idx to e4m3 by the same rule and scores with the e4m3 x e4m3 dot
    (tensor cores at twice the bf16 rate). int8 index keys (``kernels.decode.quantize_int8_rows``, the same
    scales): q_idx rounded to int8 per row, the exact int8 x int8 dot. The torch reference computes exactly
    what each variant means.
    """
    args = (q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv)
    _validate(*args, topk, k_idx_scale)
    plan = plan_indexer(q_idx, k_idx_cache, topk, impl=impl, check_lengths=check_lengths,
                        index_fp8_dot=index_fp8_dot)
    _check_lengths(plan, *args)
    if plan.impl == "torch":
        return naive.indexer_paged_reference(*args, topk, return_lse=return_lse, k_idx_scale=k_idx_scale,
                                             fp8_dot=plan.fp8_dot)
    ids = _launch_indexer(plan, *args, k_idx_scale)
    return (ids, _launch_selected_lse(plan, *args, ids, k_idx_scale)) if return_lse else ids


def launch(plan: IndexerPlan, q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor,
           cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, k_idx_scale: torch.Tensor | None = None
           ) -> torch.Tensor:
    """Run a Triton ``plan`` from ``plan_indexer`` on inputs ``msa_indexer`` would accept (checked here):
    ids ``[T, H, k]``, block scores ``[T, H, max_pages]`` or per-row score sums ``[T, H]`` by ``plan.output``.
    For benchmarks and tests of the kernel's outputs."""
    args = (q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv)
    _validate(*args, plan.topk, k_idx_scale)
    if plan.impl != "triton":
        raise ValueError(f"{OP}: launch() runs Triton plans, got impl={plan.impl!r}")
    if (plan.fp8_keys, plan.int8_keys) != (k_idx_cache.dtype == FP8, k_idx_cache.dtype == torch.int8):
        made = "fp8" if plan.fp8_keys else "int8" if plan.int8_keys else "bf16/fp16"
        raise ValueError(f"{OP}: the plan was made for {made} index keys, "
                         f"got a {str(k_idx_cache.dtype).replace('torch.', '')} k_idx_cache: plan again")
    _check_lengths(plan, *args)
    return _launch_indexer(plan, *args, k_idx_scale)


def _check_lengths(plan, q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv) -> None:
    check_lengths(OP, cu_seqlens_q, seq_lens_kv, q_idx.shape[0], page_table, plan.block, values=plan.check_lengths)


def _launch_indexer(plan: IndexerPlan, q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, k_idx_scale):
    from .triton_indexer import _indexer_fwd_kernel

    t, h, d = q_idx.shape
    dev = q_idx.device
    tile_req, tile_start = tile_table(cu_seqlens_q, t, plan.tokens_per_tile)
    ids = torch.full((t, h, plan.topk), -7, dtype=torch.int32, device=dev)  # poison: every slot is written
    scores = aux = ids
    if plan.output == "block_scores":
        scores = torch.full((t, h, page_table.shape[1]), float("-inf"), device=dev)
    if plan.output == "score_sum":
        aux = torch.empty((t, h), dtype=torch.float32, device=dev)
    result = {"ids": ids, "block_scores": scores, "score_sum": aux}[plan.output]
    if t == 0:
        return result
    ks = k_idx_scale if plan.scaled else seq_lens_kv  # a dummy pointer without scaled keys
    _indexer_fwd_kernel[(tile_req.shape[0],)](
        q_idx, k_idx_cache, ks, page_table, cu_seqlens_q, seq_lens_kv, tile_req, tile_start, ids, scores, aux,
        q_idx.stride(0), q_idx.stride(1), k_idx_cache.stride(0), k_idx_cache.stride(1),
        ks.stride(0) if plan.scaled else 0, page_table.stride(0),
        ids.stride(0), ids.stride(1), scores.stride(0) if scores is not ids else 0,
        scores.stride(1) if scores is not ids else 0, 1.0 / math.sqrt(d),
        H=h, D=d, B=plan.block, TOPK=plan.topk, TQ=plan.tokens_per_tile, BLOCK_M=plan.tile_rows,
        MODE=plan.mode, UPCAST=plan.upcast, HAS_SCALE=plan.scaled, FP8_DOT=plan.fp8_dot, INT8_DOT=plan.int8_keys,
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    return result


def _launch_selected_lse(plan: IndexerPlan, q_idx, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv, ids,
                         k_idx_scale):
    from .triton_indexer import _selected_lse_kernel

    t, h, d = q_idx.shape
    lse = torch.full((t, h), float("nan"), dtype=torch.float32, device=q_idx.device)
    if t == 0:
        return lse
    tok_req = token_requests(cu_seqlens_q, t)
    ks = k_idx_scale if plan.scaled else seq_lens_kv  # a dummy pointer without scaled keys
    _selected_lse_kernel[(t * h,)](
        q_idx, k_idx_cache, ks, page_table, cu_seqlens_q, seq_lens_kv, tok_req, ids, lse,
        q_idx.stride(0), q_idx.stride(1), k_idx_cache.stride(0), k_idx_cache.stride(1),
        ks.stride(0) if plan.scaled else 0, page_table.stride(0), ids.stride(0), ids.stride(1), 1.0 / math.sqrt(d),
        H=h, D=d, B=plan.block, TOPK=ids.shape[2], HAS_SCALE=plan.scaled, FP8_DOT=plan.fp8_dot,
        INT8_DOT=plan.int8_keys,
        UPCAST=plan.upcast, num_warps=4)
    return lse
