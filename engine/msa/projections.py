"""Index projections of the MSA layers (msa-spec 2.1): per MSA layer an index-query projection
hidden -> Hkv x d_idx (one index head per KV group) and a shared index-key projection
hidden -> d_idx, optionally a learned per-head RMSNorm, then the main attention's RoPE.

RoPE: with d_idx == head_dim the main attention's cos/sin are used as they are; with
d_idx > head_dim the first head_dim dims are rotated and the rest pass through (partial RoPE,
as in M3); with d_idx < head_dim a rotary table of width d_idx with the model's theta and scaling.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelConfig
from engine.msa.config import MSAConfig
from engine.rope import RotaryEmbedding, apply_rope


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class LayerIndexer(nn.Module):
    """Index q/k of one layer: h `[T, hidden]` (the layer's normed input) -> q_idx `[T, Hkv, d_idx]`,
    k_idx `[T, d_idx]`, RoPE'd at the tokens' positions."""

    def __init__(self, hidden: int, num_kv_heads: int, d_idx: int, index_norm: bool, eps: float = 1e-6):
        super().__init__()
        self.num_kv_heads, self.d_idx, self.eps = num_kv_heads, d_idx, eps
        self.wq = nn.Parameter(torch.zeros(num_kv_heads * d_idx, hidden))
        self.wk = nn.Parameter(torch.zeros(d_idx, hidden))
        self.q_norm = nn.Parameter(torch.ones(d_idx)) if index_norm else None
        self.k_norm = nn.Parameter(torch.ones(d_idx)) if index_norm else None

    def forward(self, h: torch.Tensor, rope: IndexRope, cos: torch.Tensor, sin: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.index_q(h, rope, cos, sin, positions), self.index_k(h, rope, cos, sin, positions)

    def index_q(self, h, rope: IndexRope, cos, sin, positions) -> torch.Tensor:
        """`[T, hidden]` -> `[T, Hkv, d_idx]`."""
        q = F.linear(h, self.wq.to(h.dtype)).view(-1, self.num_kv_heads, self.d_idx)
        if self.q_norm is not None:
            q = _rms(q, self.q_norm, self.eps)
        return rope(q, cos, sin, positions)

    def index_k(self, h, rope: IndexRope, cos, sin, positions) -> torch.Tensor:
        """`[T, hidden]` -> `[T, d_idx]`."""
        k = F.linear(h, self.wk.to(h.dtype)).view(-1, 1, self.d_idx)
        if self.k_norm is not None:
            k = _rms(k, self.k_norm, self.eps)
        return rope(k, cos, sin, positions)[:, 0]


class IndexRope:
    """The main attention's RoPE, fitted to d_idx (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, d_idx: int, device: torch.device, freq_factors: torch.Tensor | None = None):
        self.head_dim, self.d_idx = cfg.head_dim, d_idx
        self.own = None
        if d_idx < cfg.head_dim:
            self.own = RotaryEmbedding(cfg, device, None, head_dim=d_idx)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.own is not None:
            c, s = self.own(positions)
            return apply_rope(x, c, s)
        if self.d_idx == self.head_dim:
            return apply_rope(x, cos, sin)
        rot = apply_rope(x[..., : self.head_dim], cos, sin)
        return torch.cat([rot, x[..., self.head_dim:]], dim=-1)


class IndexProjections(nn.Module):
    """All MSA layers' index projections, keyed by layer index (a ModuleDict with str keys)."""

    def __init__(self, cfg: ModelConfig, msa: MSAConfig, eps: float = 1e-6):
        super().__init__()
        self.msa = msa
        self.layers = nn.ModuleDict({str(i): LayerIndexer(cfg.hidden_size, cfg.num_kv_heads, msa.d_idx, msa.index_norm,
                                                          eps)
                                     for i in msa.msa_layers(cfg.num_layers)})

    def __getitem__(self, layer: int) -> LayerIndexer:
        return self.layers[str(layer)]

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(int(k) for k in self.layers)

    def init_from_attention(self, weights: dict[str, torch.Tensor], cfg: ModelConfig) -> None:
        """Start from the backbone: index query of group g = mean of the group's query heads, index
        key = mean of the KV heads (first min(d, d_idx) dims; the rest small noise). A starting point
        for the KL alignment only; never used untrained."""
        d, g, dd = cfg.head_dim, cfg.group_size, self.msa.d_idx
        n = min(d, dd)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for i in self.layer_ids:
                p = f"model.layers.{i}.self_attn."
                wq = weights[p + "q_proj.weight"].float().view(cfg.num_heads, d, -1)
                wk = weights[p + "k_proj.weight"].float().view(cfg.num_kv_heads, d, -1)
                L = self[i]
                q0 = torch.randn(L.wq.shape, generator=gen).view(cfg.num_kv_heads, dd, -1) * 1e-3
                k0 = torch.randn(L.wk.shape, generator=gen) * 1e-3
                q0[:, :n] = _rope_half_pick(wq.view(cfg.num_kv_heads, g, d, -1).mean(1), n)
                k0[:n] = _rope_half_pick(wk.mean(0), n)
                L.wq.copy_(q0.view_as(L.wq))
                L.wk.copy_(k0)


def _rope_half_pick(w: torch.Tensor, n: int) -> torch.Tensor:
    """Rows of a rotate-half head `[..., d, hidden]` -> `n` rows keeping the pairing (i, i + d/2)."""
    d = w.shape[-2]
    if n == d:
        return w
    half, nh = d // 2, n // 2
    idx = torch.cat([torch.arange(nh), half + torch.arange(nh)])
    return w[..., idx, :]
