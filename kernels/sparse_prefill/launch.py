"""Launchers of the sparse prefill kernels: they run a ``PrefillPlan`` (``plan.py``) on inputs that
``op.py`` validated, and decide and check nothing themselves beyond the module the caches' dtype calls for.

``launch`` is the public entry point (the op and the benchmarks call it): regrouping, union build,
tile kernel and rare pass for the tile design, the per-token kernel for ``design="token"``; ``launch_tile``
runs the tile kernel alone over given unions. FP8 K/V: ``k_scale`` / ``v_scale`` go to every kernel launched
(the Triton kernels' ``FP8`` mode; for Gluon, ``gluon_launchers`` picks the Q8KV8 module and binds them).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from kernels._common.device import interpreting
from kernels._common.tiles import tile_table, token_requests
from kernels.sparse_prefill.grouping import group_tiles
from kernels.sparse_prefill.plan import PrefillPlan, PrefillShape, pow2, tile_wins
from kernels.sparse_prefill.unions import TileUnions, build_unions

_LOG2E = 1.4426950408889634


def launch(plan: PrefillPlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           page_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, topk_ids: torch.Tensor,
           out: torch.Tensor, lse: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None,
           v_scale: torch.Tensor | None = None) -> None:
    """Write ``out`` / ``lse`` as ``plan`` says (``plan.kernel`` "gluon", "triton" or "token"); no host
    sync except ``design="auto"``'s one (``plan.auto``). ``k_scale`` / ``v_scale``: the fp32 scales of
    float8_e4m3fn caches (every kernel launched gets them), None otherwise."""
    if plan.kernel == "token":
        _launch_token(plan, q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
                      k_scale=k_scale, v_scale=v_scale)
        return
    tiles = tile_table(cu_seqlens_q, q.shape[0], plan.tile_q, longest_first=False)
    union = plan_unions(plan, topk_ids, page_table, cu_seqlens_q, tiles)
    if plan.auto and not tile_wins(plan, PrefillShape.of(q, k_cache, v_cache, page_table, topk_ids), union.count,
                                   union.rare_ids, tiles[0]):
        _launch_token(plan, q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
                      k_scale=k_scale, v_scale=v_scale)
        return
    launch_tile(plan, q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, tiles, union, out, lse, scale, k_scale, v_scale)
    if plan.rare_pass == "items":
        from kernels.sparse_prefill.rare_items import build_rare_items

        items = build_rare_items(union.rare_ids, page_table, cu_seqlens_q, plan.tile_q)
        rare = gluon_launchers(k_cache, k_scale, v_scale)[1]
        rare(plan, q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv, items, scale * _LOG2E)
    elif plan.rare_pass == "token":
        _launch_token(plan, q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union.rare_ids, out, lse,
                      scale, merge=True, k_scale=k_scale, v_scale=v_scale)


def launch_tile(plan: PrefillPlan, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, tiles: tuple[torch.Tensor, torch.Tensor],
                union: TileUnions, out: torch.Tensor, lse: torch.Tensor, scale: float,
                k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """The plan's tile kernel (Gluon or Triton) over given unions, no rare pass: ``launch``'s middle step,
    and the benchmarks' dense baseline (unions of every visible block)."""
    qk_scale = scale * _LOG2E
    if plan.kernel == "gluon":
        tile = gluon_launchers(k_cache, k_scale, v_scale)[0]
        tile(plan, q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv, tiles, union, qk_scale)
    else:
        _launch_triton_tile(plan, q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, tiles, union, out, lse, qk_scale,
                            k_scale, v_scale)


def gluon_launchers(k_cache: torch.Tensor, k_scale: torch.Tensor | None,
                    v_scale: torch.Tensor | None) -> tuple[Callable[..., None], Callable[..., None]]:
    """The Gluon (tile, rare) launchers for these caches, called as ``gluon_tile``'s: Q8KV8 (``gluon_tile_fp8``,
    the scales bound) for e4m3 caches or when scales are given (its launchers refuse a mix in one line), else
    bf16 / fp16 (``gluon_tile``). The one place that chooses between the two modules."""
    if k_cache.dtype == torch.float8_e4m3fn or k_scale is not None or v_scale is not None:
        from kernels.sparse_prefill.gluon_tile_fp8 import launch_gluon_rare_fp8, launch_gluon_tile_fp8

        return (partial(launch_gluon_tile_fp8, k_scale=k_scale, v_scale=v_scale),
                partial(launch_gluon_rare_fp8, k_scale=k_scale, v_scale=v_scale))
    from kernels.sparse_prefill.gluon_tile import launch_gluon_rare, launch_gluon_tile

    return launch_gluon_tile, launch_gluon_rare


def _scale_args(k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> tuple:
    """(KS, VS, their page and head strides, FP8): placeholders (the cache, strides 0) without fp8."""
    if k_scale is None or v_scale is None:
        return k_cache, k_cache, 0, 0, 0, 0, False
    return k_scale, v_scale, k_scale.stride(0), k_scale.stride(1), v_scale.stride(0), v_scale.stride(1), True


def plan_unions(plan: PrefillPlan, topk_ids: torch.Tensor, page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                tiles: tuple[torch.Tensor, torch.Tensor]) -> TileUnions:
    """The unions the tile kernel loops over: tiles regrouped first if ``plan.group``, rare blocks split
    off at ``plan.rare_max``."""
    tokmap = group_tiles(topk_ids, cu_seqlens_q, *tiles, plan.tile_q) if plan.group else None
    return build_unions(topk_ids, page_table, cu_seqlens_q, *tiles, plan.tile_q, rare_max=plan.rare_max,
                        tokmap=tokmap)


def _launch_token(plan: PrefillPlan, q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, ids, out, lse,
                  scale: float, merge: bool = False, k_scale=None, v_scale=None) -> None:
    """One program per (token, KV head) over ``ids``; ``merge``: the rare pass, adding ``ids``' blocks to the
    attention already in ``out`` / ``lse`` (rows without ids are left as they are) with the plan's rare
    warps, steps and stages."""
    from kernels.sparse_prefill.triton_sparse_attention import _token_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    ks, vs, s_ksp, s_ksh, s_vsp, s_vsh, fp8 = _scale_args(k_cache, k_scale, v_scale)
    _token_kernel[(t * hkv,)](
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, token_requests(cu_seqlens_q, t), ids, out, lse,
        ks, vs, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0),
        ids.stride(0), ids.stride(1), out.stride(0), out.stride(1), s_ksp, s_ksh, s_vsp, s_vsh, scale * _LOG2E,
        HKV=hkv, G=group, GP=max(16, pow2(group)), D=d, B=block, TOPK=ids.shape[2],
        UPCAST=interpreting(), MERGE=merge, FP8=fp8, KN=plan.rare_block_n if merge else 0,
        num_warps=plan.rare_warps if merge else 4, num_stages=plan.rare_stages)


def _launch_triton_tile(plan: PrefillPlan, q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, tiles, union: TileUnions,
                        out, lse, qk_scale: float, k_scale=None, v_scale=None) -> None:
    """The Triton tile kernel: one program per (tile, KV head) over its union."""
    from kernels.sparse_prefill.triton_sparse_attention import _tile_kernel

    tile_req, tile_start = tiles
    hkv, block, d = k_cache.shape[1], k_cache.shape[2], q.shape[2]
    kdesc, vdesc = k_cache, v_cache  # unused unless plan.tma
    if plan.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        rows = plan.block_n or block
        kdesc = TensorDescriptor.from_tensor(k_cache.view(-1, d), [rows, d])
        vdesc = TensorDescriptor.from_tensor(v_cache.view(-1, d), [rows, d])
    extra = dict(maxnreg=plan.maxnreg) if plan.maxnreg else {}
    ks, vs, s_ksp, s_ksh, s_vsp, s_vsh, fp8 = _scale_args(k_cache, k_scale, v_scale)
    _tile_kernel[(tile_req.shape[0] * hkv,)](
        q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, tile_req, tile_start, union.union, union.pages,
        union.token_mask, union.count, out, lse, union.tokmap if union.tokmap is not None else union.count,
        kdesc, vdesc, ks, vs, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        union.union.stride(0), union.union.stride(1), s_ksp, s_ksh, s_vsp, s_vsh, qk_scale,
        HKV=hkv, G=q.shape[1] // hkv, TQ=plan.tile_q, BLOCK_M=plan.block_m, D=d, B=block, UPCAST=interpreting(),
        BN=plan.block_n, GROUPED=union.tokmap is not None, TMA=plan.tma, FP8=fp8, num_warps=plan.num_warps,
        num_stages=plan.num_stages, **extra)

