"""FP8 (e4m3) K/V: the one quantisation rule every FP8 path shares, and the one check of the device.

Rule (per row of the last dim: one token of one KV head): ``scale = max(amax(|x|), 1e-12) / 448`` in
fp32, ``x8 = e4m3(clamp(x / scale, -448, 448))`` rounded to nearest even; the value it stands for is
``x8 * scale``. The KV cache keeps ``x8`` beside a fp32 scale per (page, KV head, slot), so a token's scale
is written once, with the token, by the RoPE + cache-write kernel, and decode can append one token at a
time. Kernels multiply scores by the key scales and fold the value scales into the probabilities.

FP8 tensor cores (and Triton's fp8 dot) need compute capability 8.9 or newer (Ada, Hopper, Blackwell).
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn
KV_DTYPES = ("auto", "bf16", "fp8", "fp8-hadamard")


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., d]`` float -> (e4m3 ``[..., d]``, fp32 scale ``[...]``) by the module's rule."""
    if not x.is_floating_point() or x.dtype == FP8:
        raise ValueError(f"quantize_rows needs bf16/fp16/fp32 values, got {x.dtype}")
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / E4M3_MAX
    x8 = (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return x8, scale.contiguous()


def dequantize_rows(x8: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3 ``[..., d]`` and fp32 ``[...]`` -> ``x8 * scale`` in ``dtype`` (computed in fp32)."""
    return (x8.float() * scale.float()[..., None]).to(dtype)


def hadamard(d: int, device: torch.device | None = None) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix ``[d, d]`` (d a power of two), fp32: ``(q H) . (k H) = q . k``,
    and a channel of ``k`` that dwarfs the others is spread over all of them before a row's e4m3 scale is taken
    (the ``fp8-hadamard`` cache: ``benchmarks/quality/fp8_error.py`` measures the gain)."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two dimension, got {d}")
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d ** 0.5


def fp8_supported(device: torch.device) -> bool:
    """Whether ``device`` runs FP8 tensor-core kernels (CUDA compute capability >= 8.9)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def require_fp8(what: str, device: torch.device) -> None:
    """Raise one line when ``what`` asks for FP8 kernels on a device without FP8 tensor cores."""
    if device.type == "cuda" and not fp8_supported(device):
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        raise ValueError(f"{what}: FP8 K/V needs FP8 tensor cores (compute capability >= 8.9: Ada, Hopper, "
                         f"Blackwell), this GPU is {cap}; use --kv-cache-dtype bf16")
