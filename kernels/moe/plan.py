"""Every choice of the MoE ops, made once from the shapes: ``plan_route`` and ``plan_experts``.

The experts' tile configuration follows the average rows per expert ``T * k / E`` (shapes only, so a
CUDA graph captured at one T replays for any routing):

* decode (<= 16 rows per expert): 16-row blocks, 64-column tiles (32 when at most 16 pairs are routed:
  a batch-1 step's 4 experts need the extra programs) and 128-deep K steps, so the chosen experts'
  weights stream through enough programs to fill the GPU (bandwidth-bound);
* middle (<= 64): 64-row blocks;
* prefill (> 64): 128 x 128 tiles (gate and up: two 128-column accumulators), 8 warps, row blocks of
  one expert grouped so their weight tiles come from L2 (compute-bound).

``MoETuning`` overrides single fields (benchmarks and kernel-variant tests).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from kernels._common.device import interpreting
from kernels._common.validate import resolve_impl

ROUTE_OP = "moe_route"
EXPERTS_OP = "moe_experts"


@dataclass(frozen=True)
class GemmConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MoETuning:
    """Overrides of the planned values; None keeps the plan's."""
    block_m: int | None = None
    gate_up: GemmConfig | None = None
    down: GemmConfig | None = None
    group_m: int | None = None


@dataclass(frozen=True)
class ExpertsPlan:
    """How ``moe_experts`` runs; the launcher reads it and decides nothing."""
    impl: str  # "triton" | "torch"
    regime: str  # "decode" | "middle" | "prefill"
    block_m: int
    gate_up: GemmConfig
    down: GemmConfig
    group_m: int
    upcast: bool  # interpreter: dot operands cast to fp32
    ieee: bool  # fp32 inputs: full-precision dot


@dataclass(frozen=True)
class RoutePlan:
    impl: str
    block_t: int
    block_k: int
    num_warps: int
    upcast: bool
    ieee: bool


_REGIMES = {  # rows per expert up to: (block_m, gate_up, down, group_m)
    "decode": (16, GemmConfig(64, 128, 4, 4), GemmConfig(64, 128, 4, 4), 1),
    "middle": (64, GemmConfig(64, 64, 4, 3), GemmConfig(128, 64, 4, 3), 4),
    "prefill": (128, GemmConfig(128, 64, 8, 3), GemmConfig(256, 64, 8, 3), 8),
}


FEW_PAIRS = 16  # at most this many routed pairs: decode tiles 32 columns wide
NARROW = GemmConfig(32, 128, 4, 4)


def regime(tokens: int, topk: int, experts: int) -> str:
    rows = tokens * topk / experts
    return "decode" if rows <= 16 else "middle" if rows <= 64 else "prefill"


def plan_experts(tokens: int, topk: int, experts: int, dtype: torch.dtype, device: torch.device, *,
                 impl: str = "auto", tuning: MoETuning | None = None) -> ExpertsPlan:
    impl = resolve_impl(impl, device, EXPERTS_OP)
    name = regime(tokens, topk, experts)
    block_m, gate_up, down, group_m = _REGIMES[name]
    if name == "decode" and tokens * topk <= FEW_PAIRS:
        gate_up = down = NARROW
    t = tuning or MoETuning()
    plan = ExpertsPlan(impl=impl, regime=name, block_m=t.block_m or block_m, gate_up=t.gate_up or gate_up,
                       down=t.down or down, group_m=t.group_m or group_m,
                       upcast=interpreting(), ieee=dtype == torch.float32)
    if interpreting():  # the interpreter: small tiles (numpy emulation), same code paths
        plan = replace(plan, gate_up=replace(plan.gate_up, block_k=min(plan.gate_up.block_k, 32)),
                       down=replace(plan.down, block_k=min(plan.down.block_k, 32)))
    return plan


def plan_route(tokens: int, dtype: torch.dtype, device: torch.device, *, impl: str = "auto") -> RoutePlan:
    impl = resolve_impl(impl, device, ROUTE_OP)
    return RoutePlan(impl=impl, block_t=16 if tokens <= 256 else 64, block_k=64 if tokens <= 256 else 32,
                     num_warps=4, upcast=interpreting(), ieee=dtype == torch.float32)
