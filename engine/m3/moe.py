"""MiniMax-M3's MLPs: the dense SwiGLU-OAI MLP and the MoE block (sigmoid router whose
`e_score_correction_bias` only chooses, top-k experts renormalised, `routed_scaling_factor`, one shared
expert). Routing and experts run `kernels.moe` on every device: its fused router kernel and Triton grouped
GEMMs on CUDA (no host sync), its fp32 torch references (one matmul pair per expert that has tokens) on the
CPU. `MoE.impl` is chosen once, by `experts_impl`, when the model is prepared.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from kernels.moe import moe_experts, moe_route
from kernels.moe.reference import swiglu_oai


class DenseMLP(nn.Module):
    """gate/up fused `[2I, H]`, down `[H, I]` (the dense layers' MLP and the MoE's shared expert)."""

    def __init__(self, hidden: int, inter: int, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit
        self.gate_up = nn.Parameter(torch.empty(2 * inter, hidden), requires_grad=False)
        self.down = nn.Parameter(torch.empty(hidden, inter), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(swiglu_oai(F.linear(x, self.gate_up), self.alpha, self.limit), self.down)


class MoE(nn.Module):
    """Router `[E, H]` + correction bias `[E]`, experts w13 `[E, 2I, H]` (w1 then w3), w2 `[E, H, I]`,
    one shared expert."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m3 = cfg.m3
        assert m3 is not None
        E, H, inter = m3.num_experts, cfg.hidden_size, m3.moe_intermediate_size
        self.k, self.scaling, self.alpha, self.limit = m3.experts_per_token, m3.routed_scaling_factor, \
            m3.swiglu_alpha, m3.swiglu_limit
        self.router = nn.Parameter(torch.empty(E, H), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(E), requires_grad=False)
        self.w13 = nn.Parameter(torch.empty(E, 2 * inter, H), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(E, H, inter), requires_grad=False)
        self.shared = DenseMLP(H, m3.shared_intermediate_size, self.alpha, self.limit)
        self.impl = "torch"  # set by the model's `prepare(device)` (`experts_impl`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.routed(x) + self.shared(x)

    def routed(self, x: torch.Tensor, first_expert: int | None = None) -> torch.Tensor:
        """The scaled routed part `[T, H]` through `kernels.moe` in this block's `impl` (its fused router and
        grouped GEMMs on CUDA, no host sync; its fp32 references on the CPU); `first_expert`: these
        experts are global `first_expert..` (expert parallel), the other experts' pairs add nothing."""
        weights, ids = moe_route(x, self.router, self.bias, self.k, impl=self.impl)
        return moe_experts(x, self.w13, self.w2, weights, ids, alpha=self.alpha, limit=self.limit,
                           scaling=self.scaling, first_expert=first_expert, impl=self.impl)


def experts_impl(device: torch.device) -> str:
    """"triton" (`kernels.moe`'s fused router and grouped GEMMs) on CUDA, else "torch" (its references)."""
    return "triton" if torch.device(device).type == "cuda" else "torch"
