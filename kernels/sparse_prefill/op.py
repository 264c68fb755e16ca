"""Public MSA sparse prefill attention op: validation, then the plan (``plan.py``) and its launch."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import torch

from kernels._common.device import device_info
from kernels._common.fp8 import FP8, require_fp8
from kernels._common.validate import (
    check_choice,
    check_kv_scales,
    check_lengths,
    check_size,
    check_tensor,
    check_topk_ids,
    resolve_impl,
)
from kernels.sparse_prefill import naive
from kernels.sparse_prefill.launch import launch
from kernels.sparse_prefill.plan import OP, PrefillShape, TileConfig, plan_prefill

__all__ = ["msa_prefill_attention"]

TOPK_CHOICES = (4, 8, 16, 32)
BLOCK_CHOICES = (64, 128)
HEAD_DIM_CHOICES = (64, 128)


def _validate(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, impl, check_ids,
              lengths=True, k_scale=None, v_scale=None):
    check_tensor(OP, "q", q, ndim=3, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    impl = resolve_impl(impl, q.device, OP)
    if impl == "triton" and q.dtype == torch.float32:
        raise ValueError(f"{OP}: the Triton kernel takes bfloat16 or float16 q, got float32; use impl='torch'")
    dev = q.device
    check_tensor(OP, "k_cache", k_cache, ndim=4, dtypes=(q.dtype, FP8), device=dev)
    check_tensor(OP, "v_cache", v_cache, ndim=4, dtypes=(q.dtype, FP8), device=dev)
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"{OP}: k_cache and v_cache must share one dtype (q's, or both float8_e4m3fn with "
                         f"k_scale / v_scale), got {k_cache.dtype} and {v_cache.dtype}")
    check_kv_scales(OP, k_cache, v_cache, k_scale, v_scale)
    if k_cache.dtype == FP8 and impl == "triton":
        require_fp8(OP, dev)
    check_tensor(OP, "page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "seq_lens_kv", seq_lens_kv, ndim=1, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "topk_ids", topk_ids, ndim=3, dtypes=(torch.int32,), device=dev)
    t, hq, d = q.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"{OP}: v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    _, hkv, block, dk = k_cache.shape
    check_size(OP, "k_cache", dk, d, "head dim (q's last dim)")
    check_choice(OP, "head dim", d, HEAD_DIM_CHOICES)
    check_choice(OP, "block size (k_cache dim 2)", block, BLOCK_CHOICES)
    if hkv < 1 or hq % hkv or not 1 <= hq // hkv <= 16:
        raise ValueError(f"{OP}: query heads must be a multiple 1..16 of KV heads, got Hq={hq}, Hkv={hkv}")
    check_size(OP, "topk_ids", topk_ids.shape[0], t, "dim 0 (tokens)")
    check_size(OP, "topk_ids", topk_ids.shape[1], hkv, "dim 1 (KV heads)")
    check_choice(OP, "topk (topk_ids dim 2)", topk_ids.shape[2], TOPK_CHOICES)
    check_lengths(OP, cu_seqlens_q, seq_lens_kv, t, page_table, block, values=lengths or impl == "torch")
    if check_ids:
        check_topk_ids(OP, topk_ids, cu_seqlens_q, seq_lens_kv, block)
    return impl


def msa_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          page_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor,
                          topk_ids: torch.Tensor, *, scale: float | None = None,
                          impl: Literal["auto", "triton", "torch"] = "auto",
                          design: Literal["auto", "tile", "token"] = "auto", tile_q: int | None = None,
                          check_ids: bool = True, out: torch.Tensor | None = None,
                          lse: torch.Tensor | None = None, rare_max: int | None = None,
                          tile_config: TileConfig | None = None, check_lengths: bool = True,
                          k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention of packed queries over their selected blocks in the paged KV cache.

    q ``[T, Hq, d]``, k_cache / v_cache ``[pages, Hkv, B, d]``, page_table int32 ``[R, max_pages]``,
    cu_seqlens_q int32 ``[R+1]``, seq_lens_kv int32 ``[R]`` (including this chunk), topk_ids int32
    ``[T, Hkv, k]`` logical block ids (valid prefix, -1 padding). Returns ``out [T, Hq, d]`` in q's
    dtype and ``lse [T, Hq]`` fp32 (natural log; -inf and zero output for an empty selection).

    ``design`` picks the kernels (``plan.py`` says which run where): ``tile`` shares K/V pages among
    ``tile_q`` neighbouring tokens, ``token`` runs one program per token (the simple fallback);
    ``auto`` builds the tile unions and takes ``tile`` unless the mean union is past the measured
    break-even (``plan.tile_wins``; one host sync).
    ``rare_max`` (tile design): blocks selected by at most this many of a tile's tokens are left out
    of the tile's shared loop and added by a second pass (``None``: the plan's default; 0: off).
    ``tile_config`` (``TileConfig``) overrides the tile design's plan; its ``tile_q`` / ``rare_max``
    win over the two arguments of those names.
    ``check_ids`` validates the ids on the device (one host sync; timing runs turn it off).
    ``check_lengths=False`` skips the host-side check of the length values (one more sync; the
    shapes are still checked): for callers that built the lengths themselves, such as the engine.
    With both off the tile design has no host sync.
    ``out`` / ``lse``: optional preallocated outputs of those shapes (q's dtype / fp32, contiguous);
    the kernels write every element (the tests pass NaN-poisoned buffers to prove it).
    ``k_scale`` / ``v_scale``: fp32 ``[pages, Hkv, B]``, required with float8_e4m3fn caches (and only
    with them; ``kernels._common.fp8``: value = x8 * scale). q stays bf16/fp16 (fp32 on the torch path);
    the kernels run Q8KV8 (q rounded to e4m3 per (token, head) row, e4m3 QK and PV dots, fp32 online
    softmax: ``triton_sparse_attention``), the torch path dequantises exactly. FP8 kernels need compute
    capability >= 8.9.
    """
    impl = _validate(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, impl, check_ids,
                     check_lengths, k_scale, v_scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    t, hq, d = q.shape
    if impl == "torch":
        ref_out, ref_lse = naive.sparse_attention_reference(q, k_cache, v_cache, page_table, cu_seqlens_q,
                                                            seq_lens_kv, topk_ids, scale, k_scale=k_scale,
                                                            v_scale=v_scale)
        if out is not None:
            ref_out = _output(out, (t, hq, d), q.dtype, q.device, "out").copy_(ref_out)
        if lse is not None:
            ref_lse = _output(lse, (t, hq), torch.float32, q.device, "lse").copy_(ref_lse)
        return ref_out, ref_lse
    cfg = tile_config or TileConfig()
    cfg = replace(cfg, tile_q=cfg.tile_q or tile_q, rare_max=rare_max if cfg.rare_max is None else cfg.rare_max)
    plan = plan_prefill(PrefillShape.of(q, k_cache, v_cache, page_table, topk_ids), device_info(q.device), impl=impl,
                        design=design, config=cfg)
    out = _output(out, (t, hq, d), q.dtype, q.device, "out")
    lse = _output(lse, (t, hq), torch.float32, q.device, "lse")
    if t > 0:
        launch(plan, q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
               k_scale=k_scale, v_scale=v_scale)
    return out, lse


def _output(buf, shape, dtype, device, name):
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != device or not buf.is_contiguous():
        raise ValueError(f"{OP}: {name} must be a contiguous {dtype} tensor of shape {shape} on {device}, "
                         f"got {buf.dtype} {tuple(buf.shape)} on {buf.device}")
    return buf
