"""Plain decode functions for the engine: one dispatch point per op.

``impl="auto"`` runs Triton on CUDA tensors and the fp32 torch reference on CPU tensors;
``"triton"`` on CPU tensors needs TRITON_INTERPRET=1 (else ValueError); ``"torch"`` always runs the
reference. Each call validates the metadata values (a host sync): inside CUDA graphs use the plan
classes instead. Outputs are freshly allocated.
"""
from __future__ import annotations

import torch

from . import naive, validate
from .dispatch import resolve_impl
from .plan import DenseDecodePlan, MSADecodePlan


def msa_decode_indexer(
    q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
    q_len: int, topk: int = 16, k_idx_scale: torch.Tensor | None = None, impl: str = "auto",
    num_splits: int | None = None,
) -> torch.Tensor:
    """Top-k logical pages per (query token, index head): int32 ``[R*q_len, H, topk]``, own page last, -1 padded.

    q_idx ``[R*q_len, H, d_idx]`` (H = Hkv); k_idx_cache ``[P, B, d_idx]`` (float8_e4m3fn needs the
    per-token fp32 ``k_idx_scale [P, B]``); page_table int32 ``[R, max_pages]``; seq_lens int32 ``[R]``.
    """
    kind = resolve_impl(impl, q_idx.device)
    validate.check_metadata_shapes(seq_lens, page_table, q_len)
    heads, page, d_idx = validate.check_index_tensors(q_idx, k_idx_cache, k_idx_scale, seq_lens.shape[0] * q_len, topk)
    validate.check_metadata_values(seq_lens, page_table, q_len, page, num_pages=k_idx_cache.shape[0])
    if kind == "torch":
        return naive.decode_indexer_ref(q_idx, k_idx_cache, page_table, seq_lens, q_len, topk, k_idx_scale)
    plan = MSADecodePlan(heads, heads, 16, page, topk=topk, index_dim=d_idx, device=q_idx.device,
                         dtype=q_idx.dtype if q_idx.dtype != torch.float8_e4m3fn else torch.bfloat16,
                         impl="triton", indexer_splits=num_splits)
    plan.plan(seq_lens, page_table, q_len)
    return plan.run_indexer(q_idx, k_idx_cache, k_idx_scale)


def _attention_plan(cls, q, k_cache, seq_lens, page_table, q_len, softmax_scale, return_lse, num_splits, **extra):
    plan = cls(q.shape[1], k_cache.shape[1], q.shape[2], k_cache.shape[2], device=q.device, dtype=q.dtype,
               softmax_scale=softmax_scale, return_lse=return_lse, impl="triton", num_splits=num_splits, **extra)
    plan.plan(seq_lens, page_table, q_len)
    return plan


def msa_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, topk_ids: torch.Tensor,
    page_table: torch.Tensor, seq_lens: torch.Tensor, q_len: int, softmax_scale: float | None = None,
    return_lse: bool = False, impl: str = "auto", num_splits: int | None = None,
):
    """Sparse paged decode attention over the selected pages.

    q ``[R*q_len, Hq, d]``; caches ``[P, Hkv, B, d]``; topk_ids int32 ``[R*q_len, Hkv, k]`` logical
    pages (-1 = unused). Returns out ``[R*q_len, Hq, d]`` in q's dtype (and fp32 natural-log LSE
    ``[R*q_len, Hq]`` with ``return_lse``).
    """
    kind = resolve_impl(impl, q.device)
    validate.check_metadata_shapes(seq_lens, page_table, q_len)
    tokens = seq_lens.shape[0] * q_len
    _, hkv, page, _ = validate.check_attention_tensors(q, k_cache, v_cache, tokens)
    validate.check_metadata_values(seq_lens, page_table, q_len, page, num_pages=k_cache.shape[0])
    validate.check_topk_ids(topk_ids, tokens, hkv)
    if kind == "torch":
        out, lse = naive.sparse_decode_attention_ref(q, k_cache, v_cache, topk_ids, page_table, seq_lens, q_len,
                                                     softmax_scale)
        return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)
    plan = _attention_plan(MSADecodePlan, q, k_cache, seq_lens, page_table, q_len, softmax_scale, return_lse,
                           num_splits, topk=max(2, min(64, topk_ids.shape[2])), index_dim=16)
    out = plan.run_attention(q, k_cache, v_cache, topk_ids=topk_ids)
    return (out, plan.lse) if return_lse else out


def dense_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    seq_lens: torch.Tensor, q_len: int, softmax_scale: float | None = None, return_lse: bool = False,
    impl: str = "auto", num_splits: int | None = None,
):
    """Dense causal paged decode attention over every page of each request (same shapes as above)."""
    kind = resolve_impl(impl, q.device)
    validate.check_metadata_shapes(seq_lens, page_table, q_len)
    _, _, page, _ = validate.check_attention_tensors(q, k_cache, v_cache, seq_lens.shape[0] * q_len)
    validate.check_metadata_values(seq_lens, page_table, q_len, page, num_pages=k_cache.shape[0])
    if kind == "torch":
        out, lse = naive.dense_decode_attention_ref(q, k_cache, v_cache, page_table, seq_lens, q_len, softmax_scale)
        return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)
    plan = _attention_plan(DenseDecodePlan, q, k_cache, seq_lens, page_table, q_len, softmax_scale, return_lse,
                           num_splits)
    out = plan.run(q, k_cache, v_cache)
    return (out, plan.lse) if return_lse else out
