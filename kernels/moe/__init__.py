"""MiniMax-M3 MoE: the sigmoid top-k router and the routed SwiGLU-OAI experts as Triton grouped GEMMs
over expert-sorted row blocks, with fp32 torch references beside them (see README.md).
"""
from . import reference
from .align import Alignment, align_tokens, aligned_rows
from .op import launch, moe_experts, moe_route
from .plan import ExpertsPlan, GemmConfig, MoETuning, RoutePlan, plan_experts, plan_route

__all__ = [
    "Alignment",
    "ExpertsPlan",
    "GemmConfig",
    "MoETuning",
    "RoutePlan",
    "align_tokens",
    "aligned_rows",
    "launch",
    "moe_experts",
    "moe_route",
    "plan_experts",
    "plan_route",
    "reference",
]
