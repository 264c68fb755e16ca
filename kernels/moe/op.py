"""Public MoE ops: validate, plan, launch.

``moe_route`` picks each token's experts (M3's sigmoid router with the correction bias);
``moe_experts`` runs the routed experts (SwiGLU-OAI) and returns their weighted, scaled sum. Neither
reads a tensor value on the host: both are CUDA-graph safe on the Triton path (expert ids must lie in
``[0, E)``, or with ``first_expert`` anywhere; they are not checked, a check would be a host sync).
"""
from __future__ import annotations

import torch

from kernels._common.validate import check_size, check_tensor

from . import reference
from .align import align_tokens
from .plan import EXPERTS_OP, ROUTE_OP, ExpertsPlan, MoETuning, RoutePlan, plan_experts, plan_route

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def moe_route(x: torch.Tensor, router_w: torch.Tensor, bias: torch.Tensor | None, topk: int, *,
              impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights fp32 ``[T, k]`` (sum 1 per token) and expert ids int32 ``[T, k]``, best first.

    x ``[T, H]``; router_w ``[E, H]`` in x's dtype or fp32; bias ``[E]`` (the correction bias, used for
    choosing only) or None. Logits accumulate in fp32; ties go to the smaller expert id.
    """
    check_tensor(ROUTE_OP, "x", x, ndim=2, dtypes=FLOATS)
    dev = x.device
    check_tensor(ROUTE_OP, "router_w", router_w, ndim=2, dtypes=tuple({x.dtype, torch.float32}), device=dev)
    check_size(ROUTE_OP, "router_w", router_w.shape[1], x.shape[1], "dim 1 (x's hidden size)")
    experts = router_w.shape[0]
    if bias is not None:
        check_tensor(ROUTE_OP, "bias", bias, ndim=1, dtypes=FLOATS, device=dev)
        check_size(ROUTE_OP, "bias", bias.shape[0], experts, "length (experts)")
    if not isinstance(topk, int) or not 1 <= topk <= min(experts, 16):
        raise ValueError(f"{ROUTE_OP}: topk must be an int in 1..min(experts, 16) = {min(experts, 16)}, got {topk!r}")
    plan = plan_route(x.shape[0], x.dtype if router_w.dtype == x.dtype else torch.float32, dev, impl=impl)
    if plan.impl == "torch":
        return reference.route_reference(x, router_w, bias, topk)
    return _launch_route(plan, x, router_w, bias, topk)


def _launch_route(plan: RoutePlan, x, router_w, bias, topk):
    from .triton_moe import _route_kernel

    t, h = x.shape
    experts = router_w.shape[0]
    weights = torch.empty((t, topk), dtype=torch.float32, device=x.device)
    ids = torch.empty((t, topk), dtype=torch.int32, device=x.device)
    if t == 0:
        return weights, ids
    if router_w.dtype != x.dtype:  # fp32 router weights: fp32 logits of the upcast tokens
        x = x.float()
    _route_kernel[(-(-t // plan.block_t),)](
        x, router_w, bias if bias is not None else weights, weights, ids, t, h, experts, x.stride(0),
        router_w.stride(0), TOPK=topk, KP=max(2, 1 << (topk - 1).bit_length()), BLOCK_T=plan.block_t,
        EP=max(16, 1 << (experts - 1).bit_length()), BLOCK_K=plan.block_k, HAS_BIAS=bias is not None,
        UPCAST=plan.upcast, IEEE=plan.ieee, num_warps=plan.num_warps)
    return weights, ids


def _validate_experts(x, w13, w2, weights, ids) -> None:
    op = EXPERTS_OP
    check_tensor(op, "x", x, ndim=2, dtypes=FLOATS)
    dev = x.device
    check_tensor(op, "w13", w13, ndim=3, dtypes=(x.dtype,), device=dev)
    check_tensor(op, "w2", w2, ndim=3, dtypes=(x.dtype,), device=dev)
    check_tensor(op, "weights", weights, ndim=2, dtypes=(torch.float32,), device=dev)
    check_tensor(op, "ids", ids, ndim=2, dtypes=(torch.int32,), device=dev)
    t, h = x.shape
    e, two_i, _ = w13.shape
    check_size(op, "w13", w13.shape[2], h, "dim 2 (x's hidden size)")
    if two_i % 2:
        raise ValueError(f"{op}: w13 must be [E, 2I, H] (gate rows, then up rows), got an odd dim 1 = {two_i}")
    check_size(op, "w2", w2.shape[0], e, "dim 0 (experts, as w13)")
    check_size(op, "w2", w2.shape[1], h, "dim 1 (x's hidden size)")
    check_size(op, "w2", w2.shape[2], two_i // 2, "dim 2 (I = w13 dim 1 / 2)")
    check_size(op, "ids", ids.shape[0], t, "dim 0 (x's tokens)")
    if tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"{op}: weights {tuple(weights.shape)} and ids {tuple(ids.shape)} must have one shape [T, k]")
    if not ids.is_contiguous() or not weights.is_contiguous():
        raise ValueError(f"{op}: weights and ids must be contiguous; pass .contiguous()")


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                *, alpha: float, limit: float, scaling: float = 1.0, first_expert: int | None = None,
                impl: str = "auto", tuning: MoETuning | None = None) -> torch.Tensor:
    """``scaling * sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` ``[T, H]`` in x's dtype.

    x ``[T, H]``; w13 ``[E, 2I, H]`` (gate rows, then up rows) and w2 ``[E, H, I]`` in x's dtype;
    weights fp32 and ids int32 ``[T, k]`` (``moe_route``'s outputs). Expert: SwiGLU-OAI with ``alpha``
    and the clamp ``limit`` (see ``reference``). Expert parallel: with ``first_expert`` the ids are global,
    ``w13[e]`` / ``w2[e]`` hold expert ``first_expert + e``, and pairs routed to experts this call does not
    hold add nothing (no compute, no weight read).
    """
    _validate_experts(x, w13, w2, weights, ids)
    if first_expert is not None and (not isinstance(first_expert, int) or first_expert < 0):
        raise ValueError(f"{EXPERTS_OP}: first_expert must be None or an int >= 0, got {first_expert!r}")
    plan = plan_experts(x.shape[0], ids.shape[1], w13.shape[0], x.dtype, x.device, impl=impl, tuning=tuning)
    if plan.impl == "torch":
        return reference.experts_reference(x, w13, w2, weights, ids, alpha=alpha, limit=limit, scaling=scaling,
                                           first_expert=first_expert).to(x.dtype)
    return launch(plan, x, w13, w2, weights, ids, alpha=alpha, limit=limit, scaling=scaling,
                  first_expert=first_expert)


def launch(plan: ExpertsPlan, x, w13, w2, weights, ids, *, alpha: float, limit: float, scaling: float,
           first_expert: int | None = None):
    """Run a Triton ``plan`` (inputs as ``moe_experts`` takes them, not checked here)."""
    from .triton_moe import _down_kernel, _gate_up_kernel

    t, h = x.shape
    e, two_i, _ = w13.shape
    inter, topk = two_i // 2, ids.shape[1]
    if t == 0:
        return torch.empty_like(x)
    align = align_tokens(ids, e, plan.block_m, first_expert)
    rows = align.sorted_ids.shape[0]
    n_blocks = rows // plan.block_m
    hbuf = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    g1 = plan.gate_up
    _gate_up_kernel[(n_blocks * -(-inter // g1.block_n),)](
        x, w13, align.sorted_ids, align.block_expert, hbuf, n_blocks, t * topk, inter, h,
        x.stride(0), w13.stride(0), w13.stride(1), hbuf.stride(0), float(alpha), float(limit),
        TOPK=topk, BLOCK_M=plan.block_m, BLOCK_N=g1.block_n, BLOCK_K=g1.block_k, GROUP_M=plan.group_m,
        EVEN_K=h % g1.block_k == 0, UPCAST=plan.upcast, IEEE=plan.ieee, num_warps=g1.num_warps,
        num_stages=g1.num_stages)
    # one row per pair, each written by the down kernel; expert parallel: another rank's pairs stay 0
    out = (torch.empty if first_expert is None else torch.zeros)((t * topk, h), dtype=x.dtype, device=x.device)
    g2 = plan.down
    _down_kernel[(n_blocks * -(-h // g2.block_n),)](
        hbuf, w2, align.sorted_ids, align.block_expert, weights, out, n_blocks, t * topk, h, inter,
        hbuf.stride(0), w2.stride(0), w2.stride(1), out.stride(0), float(scaling),
        TOPK=topk, BLOCK_M=plan.block_m, BLOCK_N=g2.block_n, BLOCK_K=g2.block_k, GROUP_M=plan.group_m,
        EVEN_K=inter % g2.block_k == 0, UPCAST=plan.upcast, IEEE=plan.ieee,
        num_warps=g2.num_warps, num_stages=g2.num_stages)
    return out.view(t, topk, h).sum(1) if topk > 1 else out
