"""FP8 (e4m3) index keys: half the bytes the decode indexer must read.

Per-token symmetric scale: ``scale = amax(|k|) / 448`` over d_idx, ``k8 = e4m3(k / scale)``;
the indexer scores ``scale * (q . k8)``. Approximate: rounding to 3 mantissa bits can reorder
pages whose max scores are within about 2^-4 relative of each other, so selections can differ
from bf16 keys on near-ties (the benchmark reports the measured agreement).
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0


def quantize_index_keys(k_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., d_idx]`` float keys -> (float8_e4m3fn keys ``[..., d_idx]``, fp32 scale ``[...]``)."""
    if not k_idx.is_floating_point() or k_idx.dtype == torch.float8_e4m3fn:
        raise ValueError(f"quantize_index_keys needs bf16/fp16/fp32 keys, got {k_idx.dtype}")
    kf = k_idx.float()
    scale = kf.abs().amax(dim=-1).clamp(min=1e-12) / E4M3_MAX
    k8 = (kf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return k8, scale.contiguous()


def dequantized_index_queries(q_idx: torch.Tensor) -> torch.Tensor:
    """What ``index_fp8_dot`` scores with: q_idx ``[T, H, d_idx]`` rounded to e4m3 with a per-row scale
    ``amax(|q|) / 448``, returned dequantised in fp32 (for references and agreement checks)."""
    qf = q_idx.float()
    scale = qf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30) / E4M3_MAX
    return (qf / scale).to(torch.float8_e4m3fn).float() * scale
