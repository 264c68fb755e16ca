"""Plain decode functions: validate, build a one-step plan, run it.

Each call validates the metadata values (a host sync) and allocates its outputs: use them eagerly;
inside CUDA graphs use the plan classes. ``impl`` is resolved by the plan (``"auto"``: Triton on
CUDA tensors, the fp32 torch reference on CPU tensors; ``"triton"`` on CPU needs TRITON_INTERPRET=1).
"""
from __future__ import annotations

import torch

from kernels._common import validate

from .plan import DecodeTuning, DenseDecodePlan, MSADecodePlan


def msa_decode_indexer(
    q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor,
    q_len: int, topk: int = 16, k_idx_scale: torch.Tensor | None = None, impl: str = "auto",
    num_splits: int | None = None,
) -> torch.Tensor:
    """Top-k logical pages per (query token, index head): int32 ``[R*q_len, H, topk]``, own page last, -1 padded.

    q_idx ``[R*q_len, H, d_idx]`` (H = Hkv); k_idx_cache ``[P, B, d_idx]`` (float8_e4m3fn and int8 need the
    per-token fp32 ``k_idx_scale [P, B]``); page_table int32 ``[R, max_pages]``; seq_lens int32 ``[R]``.
    """
    op = "msa_decode_indexer"
    validate.check_decode_metadata(op, seq_lens, page_table, q_len)
    heads, page, d_idx = validate.check_index_tensors(op, q_idx, k_idx_cache, k_idx_scale,
                                                      seq_lens.shape[0] * q_len, topk)
    dtype = q_idx.dtype if q_idx.dtype != torch.float8_e4m3fn else torch.bfloat16
    plan = MSADecodePlan(heads, heads, 16, page, topk=topk, index_dim=d_idx, index_dtype=k_idx_cache.dtype,
                         device=q_idx.device, dtype=dtype, impl=impl, tuning=DecodeTuning(index_splits=num_splits))
    plan.plan(seq_lens, page_table, q_len, num_pages=k_idx_cache.shape[0])
    return plan.run_indexer(q_idx, k_idx_cache, k_idx_scale)


def msa_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, topk_ids: torch.Tensor,
    page_table: torch.Tensor, seq_lens: torch.Tensor, q_len: int, softmax_scale: float | None = None,
    return_lse: bool = False, impl: str = "auto", num_splits: int | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
):
    """Sparse paged decode attention over the selected pages.

    q ``[R*q_len, Hq, d]``; caches ``[P, Hkv, B, d]`` in q's dtype, or float8_e4m3fn with fp32
    ``k_scale``/``v_scale [P, Hkv, B]`` (``kernels._common.fp8.quantize_rows``); topk_ids int32
    ``[R*q_len, Hkv, k]`` logical pages (-1 = unused). Returns out ``[R*q_len, Hq, d]`` in q's dtype (and
    fp32 natural-log LSE ``[R*q_len, Hq]`` with ``return_lse``).
    """
    op = "msa_decode_attention"
    validate.check_decode_metadata(op, seq_lens, page_table, q_len)
    hq, hkv, page, d = validate.check_attention_tensors(op, q, k_cache, v_cache, seq_lens.shape[0] * q_len,
                                                        k_scale, v_scale)
    topk = validate.check_topk_shape(op, topk_ids, q.shape[0], hkv)
    plan = MSADecodePlan(hq, hkv, d, page, topk=max(2, min(64, topk)), index_dim=16, device=q.device,
                         dtype=q.dtype, softmax_scale=softmax_scale, return_lse=return_lse, impl=impl,
                         tuning=DecodeTuning(attn_splits=num_splits), kv_dtype=k_cache.dtype)
    plan.plan(seq_lens, page_table, q_len, num_pages=k_cache.shape[0])
    out = plan.run_attention(q, k_cache, v_cache, topk_ids=topk_ids, k_scale=k_scale, v_scale=v_scale)
    return (out, plan.lse) if return_lse else out


def dense_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
    seq_lens: torch.Tensor, q_len: int, softmax_scale: float | None = None, return_lse: bool = False,
    impl: str = "auto", num_splits: int | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
):
    """Dense causal paged decode attention over every page of each request (same shapes as above)."""
    op = "dense_decode_attention"
    validate.check_decode_metadata(op, seq_lens, page_table, q_len)
    hq, hkv, page, d = validate.check_attention_tensors(op, q, k_cache, v_cache, seq_lens.shape[0] * q_len,
                                                        k_scale, v_scale)
    plan = DenseDecodePlan(hq, hkv, d, page, device=q.device, dtype=q.dtype, softmax_scale=softmax_scale,
                           return_lse=return_lse, impl=impl, tuning=DecodeTuning(attn_splits=num_splits),
                           kv_dtype=k_cache.dtype)
    plan.plan(seq_lens, page_table, q_len, num_pages=k_cache.shape[0])
    out = plan.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale)
    return (out, plan.lse) if return_lse else out
