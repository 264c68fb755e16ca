"""FP8 (e4m3) index keys: half the bytes the decode indexer must read.

The rule is the shared one (`kernels._common.fp8.quantize_rows`): per token, ``scale = amax(|k|) / 448``
over d_idx, ``k8 = e4m3(k / scale)``; the indexer scores ``scale * (q . k8)``. Approximate: rounding to
3 mantissa bits can reorder pages whose max scores are within about 2^-4 relative of each other, so
selections can differ from bf16 keys on near-ties (`engine.msa.fp8_agreement` measures how often on the
default model's own activations; `benchmarks/quality/fp8_agreement.py` reports it).
"""
from __future__ import annotations

import torch

from kernels._common.fp8 import E4M3_MAX, dequantize_rows, quantize_rows

__all__ = ["E4M3_MAX", "dequantized_index_queries", "quantize_index_keys"]


def quantize_index_keys(k_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., d_idx]`` float keys -> (float8_e4m3fn keys ``[..., d_idx]``, fp32 scale ``[...]``)."""
    if not k_idx.is_floating_point() or k_idx.dtype == torch.float8_e4m3fn:
        raise ValueError(f"quantize_index_keys needs bf16/fp16/fp32 keys, got {k_idx.dtype}")
    return quantize_rows(k_idx)


def dequantized_index_queries(q_idx: torch.Tensor) -> torch.Tensor:
    """What ``index_fp8_dot`` scores with: q_idx ``[T, H, d_idx]`` rounded to e4m3 per (token, head) row by the
    same rule, returned dequantised in fp32 (for references and agreement checks). The kernels' row scale
    floors ``amax`` at 1e-30 where the rule floors it at 1e-12: they differ only on rows with every
    ``|q| < 1e-12``."""
    return dequantize_rows(*quantize_rows(q_idx))
