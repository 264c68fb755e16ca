"""fp32 torch references of the MiniMax-M3 MoE: the sigmoid top-k router and the SwiGLU-OAI experts.

The math (transformers' ``MiniMaxM3VLTopKRouter`` / ``MiniMaxM3VLExperts``):

* router: ``s = sigmoid(x @ Wg^T)`` in fp32 ``[T, E]``; the k experts of a token are the largest
  ``s + bias`` (the correction bias chooses, it never weighs); their weights are ``s`` at the chosen
  experts divided by the sum of those k values.
* expert e: ``[gate, up] = x @ W13[e]^T`` (gate: the first I channels), ``gate = min(gate, limit)``,
  ``up = clamp(up, -limit, limit)``, ``h = (up + 1) * gate * sigmoid(alpha * gate)``, ``y = h @ W2[e]^T``.
* routed output: ``scaling * sum_j w_j y_{e_j}`` (the shared expert is a dense MLP outside these ops).

Everything runs in fp32 on upcast inputs, one expert at a time: the CPU path and the tests' ground truth.
"""
from __future__ import annotations

import torch


def route_reference(x: torch.Tensor, router_w: torch.Tensor, bias: torch.Tensor | None,
                    topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights fp32 ``[T, k]`` (sum 1 per token) and expert ids int32 ``[T, k]``, best choice first."""
    scores = torch.sigmoid(x.float() @ router_w.float().t())
    choice = scores if bias is None else scores + bias.float()
    ids = torch.topk(choice, topk, dim=-1).indices
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True), ids.to(torch.int32)


def swiglu_oai(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """``(up + 1) * gate * sigmoid(alpha * gate)`` of ``gate_up [..., 2I]`` (gate first), both clamped."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1.0) * gate * torch.sigmoid(alpha * gate)


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                      ids: torch.Tensor, *, alpha: float, limit: float, scaling: float,
                      first_expert: int | None = None) -> torch.Tensor:
    """The routed output fp32 ``[T, H]``: ``scaling * sum_j weights[t, j] * expert_{ids[t, j]}(x[t])``.
    With ``first_expert``, ``w13[e]`` is global expert ``first_expert + e`` and other ids add nothing."""
    xf = x.float()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    local = ids.long() - (first_expert or 0)
    held = torch.unique(local.reshape(-1)).tolist()
    for e in [e for e in held if 0 <= e < w13.shape[0]] if first_expert is not None else held:
        tok, slot = (local == e).nonzero(as_tuple=True)
        h = swiglu_oai(xf[tok] @ w13[e].float().t(), alpha, limit)
        y = h @ w2[e].float().t()
        out.index_add_(0, tok, y * weights[tok, slot].float()[:, None])
    return out * scaling
