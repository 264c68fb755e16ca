"""INT8 index keys: the bytes of e4m3 keys (one per dim plus one fp32 scale per token) with 7 bits of
magnitude where e4m3 has 3 of mantissa.

Rule (per row of the last dim): ``scale = max(amax(|x|), 1e-12) / 127`` in fp32, ``x8 = round(x / scale)``
(to nearest, ties to even) as int8; the value it stands for is ``x8 * scale``. Keys are quantised once, per
token; the decode and prefill indexers round each query row the same way and score
``scale_q * scale_k * (q8 . k8)`` with an exact int32 dot (int8 tensor cores), so the selection equals the
reference's on the same rounded values up to fp32 rounding of the products. Why not e4m3: on the default
model's own index q/k (CPU, essays,
``python -m benchmarks.quality.fp8_agreement --preset headline --variants fp8_keys,int8_dot``) the history
selections at top-k 16 agree 98.6% (4K) / 98.1% (8K) with bf16 keys for e4m3 keys and 99.5% / 99.3% for int8.
"""
from __future__ import annotations

import torch

INT8_MAX = 127.0
INT8 = torch.int8


def quantize_int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., d]`` float -> (int8 ``[..., d]``, fp32 scale ``[...]``) by the module's rule."""
    if not x.is_floating_point() or x.dtype == torch.float8_e4m3fn:
        raise ValueError(f"quantize_int8_rows needs bf16/fp16/fp32 values, got {x.dtype}")
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / INT8_MAX
    x8 = torch.round(xf / scale[..., None]).clamp(-INT8_MAX, INT8_MAX).to(INT8)
    return x8, scale.contiguous()


def dequantize_int8_rows(x8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 ``[..., d]`` and fp32 ``[...]`` -> ``x8 * scale`` (fp32)."""
    return x8.float() * scale.float()[..., None]


def dequantized_int8_queries(q_idx: torch.Tensor) -> torch.Tensor:
    """What int8 index keys are scored with: q_idx ``[..., d_idx]`` rounded to int8 per row by the same rule,
    dequantised (fp32); the references score with it, as the kernel does."""
    return dequantize_int8_rows(*quantize_int8_rows(q_idx))
