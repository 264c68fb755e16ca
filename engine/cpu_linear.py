"""Reduced-precision linear layers for CPU serving: 4-bit GGUF blocks and bfloat16 weights.

A CPU decode step reads every weight once, so its time is mostly memory traffic: float32
weights of the 135M default model are 540 MB per step, bf16 270 MB, 4-bit ~75 MB.

`Int4Linear` runs torch's `_weight_int4pack_mm_for_cpu` on the GGUF's own 4-bit codes
(groups of 32 along K). A GGUF block stores w = scale * q + offset (q in 0..15; Q4_1:
scale = d, offset = m; Q4_0: scale = d, offset = -8 d); torch's kernel computes
w = (q - 8) * scale + zero, so zero = offset + 8 * scale. That kernel is fast only with
bfloat16 activations (float32 or float16 ones take a 20-100x slower path on this CPU), so the
input is rounded to bf16 and the scales/zeros are stored in bf16 (the fp16 GGUF scales lose 3
mantissa bits): one matmul differs from the float32 dequantized weight by ~3e-3 relative,
mostly from rounding x. `Bf16Linear` keeps a bf16 copy of the weight (oneDNN bf16 GEMM with
avx512_bf16). Both take `[T, K]` (any float dtype; rounded to bf16) and return the kernel's bfloat16
`[T, N]` (float32 with a bias): the consumer's first op promotes it (residual add, RoPE with
float32 cos/sin) or feeds it to the next bf16 matmul (SwiGLU -> down), so no separate cast runs.
The residual stream, norms and the attention softmax stay float32.
"""
from __future__ import annotations

import torch

GROUP = 32  # GGUF Q4_0 / Q4_1 block length along K


class Int4Linear:
    """x `[T, K]` -> `[T, N]` bfloat16 (float32 with the optional float32 bias) with 4-bit weights (group 32)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                 bias: torch.Tensor | None = None):
        """codes uint8/int `[N, K]` in 0..15; scale, offset float32 `[N, K // 32]` (w = scale * q + offset)."""
        n, k = codes.shape
        if k % GROUP or scale.shape != (n, k // GROUP) or offset.shape != scale.shape:
            raise ValueError(f"Int4Linear: codes [N, K] with K % {GROUP} == 0 and scale/offset [N, K/{GROUP}] "
                             f"expected, got {tuple(codes.shape)}, {tuple(scale.shape)}, {tuple(offset.shape)}")
        if int(codes.min()) < 0 or int(codes.max()) > 15:
            raise ValueError("Int4Linear: codes must lie in 0..15")
        self.out_features, self.in_features = n, k
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
        zero = offset.float() + 8.0 * scale.float()
        self.scale_zero = torch.stack([scale.float(), zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.bias = None if bias is None else bias.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.scale_zero)
        return y if self.bias is None else y + self.bias

    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scale_zero.numel() * 2


class Bf16Linear:
    """x `[T, K]` -> `[T, N]` bfloat16 (float32 with the optional bias) through a bfloat16 copy of the weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = weight.detach().to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.float()
        self.out_features, self.in_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(torch.bfloat16), self.weight)
        return y if self.bias is None else y + self.bias

    def nbytes(self) -> int:
        return self.weight.numel() * 2
