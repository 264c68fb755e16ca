"""MiniMax-M3's MLPs: SwiGLU-OAI (`swiglu_oai`), the dense MLP and the MoE block (sigmoid router whose
`e_score_correction_bias` only chooses, top-k experts renormalised, `routed_scaling_factor`, one shared
expert). On a CUDA device routing and experts run `kernels.moe` (a fused router kernel and Triton grouped
GEMMs, no host sync); on the CPU `route` and `experts_torch` (tokens sorted by expert, one matmul pair per
expert that has tokens). `MoE.impl` is chosen once, by `experts_impl`, when the model is prepared.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig


def swiglu_oai(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """`[T, 2I]` (gate first, not interleaved) -> `(clamp(up) + 1) * g * sigmoid(alpha * g)`, g = min(gate, limit)."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1.0) * (gate * torch.sigmoid(gate * alpha))


class DenseMLP(nn.Module):
    """gate/up fused `[2I, H]`, down `[H, I]` (the dense layers' MLP and the MoE's shared expert)."""

    def __init__(self, hidden: int, inter: int, alpha: float, limit: float):
        super().__init__()
        self.alpha, self.limit = alpha, limit
        self.gate_up = nn.Parameter(torch.empty(2 * inter, hidden), requires_grad=False)
        self.down = nn.Parameter(torch.empty(hidden, inter), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(swiglu_oai(F.linear(x, self.gate_up), self.alpha, self.limit), self.down)


def route(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 `[T, k]` summing to 1, expert ids int64 `[T, k]`): sigmoid scores, chosen by score + bias."""
    scores = torch.sigmoid(F.linear(x, router).float())
    ids = torch.topk(scores + bias.float(), k, dim=-1, sorted=False).indices
    w = scores.gather(1, ids)
    return w / w.sum(dim=-1, keepdim=True), ids


def experts_torch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                  alpha: float, limit: float) -> torch.Tensor:
    """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) `[T, H]` (x's dtype); one matmul pair per used expert."""
    T, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    tok = order // k
    out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if e >= w13.shape[0]:  # ids past the experts held: another rank's (engine.parallel), skipped
            break
        if n == 0:
            continue
        rows = order[start:start + n]
        t = tok[start:start + n]
        start += n
        h = F.linear(swiglu_oai(F.linear(x[t], w13[e]), alpha, limit), w2[e])
        out.index_add_(0, t, h.float() * weights.reshape(-1)[rows, None])
    return out.to(x.dtype)


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
        if self.impl == "triton":  # fused router kernel + grouped GEMMs, no host sync (CUDA-graph safe)
            from kernels.moe import moe_experts, moe_route

            weights, ids = moe_route(x, self.router, self.bias, self.k, impl="triton")
            routed = moe_experts(x, self.w13, self.w2, weights, ids, alpha=self.alpha, limit=self.limit,
                                 scaling=self.scaling, impl="triton")
            return routed + self.shared(x)
        weights, ids = route(x, self.router, self.bias, self.k)
        return experts_torch(x, self.w13, self.w2, weights, ids, self.alpha, self.limit) * self.scaling + self.shared(x)


def experts_impl(device: torch.device) -> str:
    """"triton" (`kernels.moe`: the fused router and grouped GEMMs) on CUDA, else "torch" (`route`, `experts_torch`)."""
    return "triton" if torch.device(device).type == "cuda" else "torch"
