"""Rotary position embeddings (rotate-half convention) with default, linear, llama3 and
yarn scaling. `RotaryEmbedding(positions)` returns cos/sin `[T, head_dim]`."""
from __future__ import annotations

import math

import torch

from engine.config import ModelConfig, RopeScaling


def inv_frequencies(head_dim: int, theta: float, s: RopeScaling,
                    freq_factors: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """Return (inv_freq [head_dim/2] fp32, attention scaling applied to cos/sin)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    mscale = 1.0
    if freq_factors is not None:  # GGUF llama3-style precomputed factors
        inv = inv / freq_factors.to(torch.float64)
    elif s.kind == "linear":
        inv = inv / s.factor
    elif s.kind == "llama3":
        low_wl = s.original_max_position / s.low_freq_factor
        high_wl = s.original_max_position / s.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (s.original_max_position / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        scaled = torch.where(wl > low_wl, inv / s.factor, inv)
        mid = (wl <= low_wl) & (wl >= high_wl)
        inv = torch.where(mid, (1 - smooth) * inv / s.factor + smooth * inv, scaled)
    elif s.kind == "yarn":
        def corr_dim(n_rot: float) -> float:
            return (head_dim * math.log(s.original_max_position / (n_rot * 2 * math.pi))) / (2 * math.log(theta))

        low = max(math.floor(corr_dim(s.beta_fast)), 0)
        high = min(math.ceil(corr_dim(s.beta_slow)), head_dim - 1)
        ramp = (torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)
        extrapolation = 1 - ramp.clamp(0, 1)
        inv = (inv / s.factor) * (1 - extrapolation) + inv * extrapolation
        mscale = s.attention_factor if s.attention_factor is not None else (
            0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0)
    return inv.to(torch.float32), mscale


class RotaryEmbedding:
    def __init__(self, cfg: ModelConfig, device: torch.device, freq_factors: torch.Tensor | None = None,
                 head_dim: int | None = None):
        d = head_dim or cfg.head_dim
        inv, self.mscale = inv_frequencies(d, cfg.rope_theta, cfg.rope_scaling, freq_factors)
        self.inv_freq = inv.to(device)

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos() * self.mscale, emb.sin() * self.mscale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[T, H, d]`, cos/sin `[T, d]` -> rotated x (same dtype)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rot = torch.cat([-x2, x1], dim=-1)
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return x * c + rot * s
