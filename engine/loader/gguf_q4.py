"""Read the 4-bit blocks of a GGUF (Q4_0, Q4_1) without dequantizing them, for `weights="q4"`.

ggml block layouts (32 weights per block, along the row):
- Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; w = d * q + m
- Q4_0: fp16 d, 16 bytes of nibbles;         w = d * (q - 8)
Byte j holds q[j] in its low nibble and q[j + 16] in its high nibble.
Every block becomes (codes, scale, offset) with w = scale * q + offset, so both types look alike.
Llama/Mistral Q and K rows are un-permuted as in `gguf_loader` (llama.cpp's interleaved RoPE).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.config import ModelConfig
from engine.loader.gguf_loader import _reader, _unpermute, hf_tensor_name, permuted_heads

_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}


@dataclass
class Q4Blocks:
    """One weight `[N, K]`: codes uint8 `[N, K]` (0..15), scale and offset float32 `[N, K // 32]`."""

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """float32 `[N, K]`: scale * q + offset."""
        n, k = self.codes.shape
        q = self.codes.view(n, k // 32, 32).float()
        return (q * self.scale[..., None] + self.offset[..., None]).reshape(n, k)


def _decode(data: np.ndarray, kind: str, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raw = np.asarray(data, dtype=np.uint8).reshape(n, k // 32, _BLOCK_BYTES[kind])
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_1":
        offset = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = raw[..., 4:]
    else:
        offset = -8.0 * d
        qs = raw[..., 2:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, k)
    return codes, d, offset


def read_q4_blocks(path: Path, cfg: ModelConfig) -> dict[str, Q4Blocks]:
    """HF-named 4-bit weights of a GGUF file (tensors of other types are left out)."""
    reader = _reader(path)
    out: dict[str, Q4Blocks] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in _BLOCK_BYTES:
            continue
        name = hf_tensor_name(t.name)
        if name is None:
            continue
        k, n = (int(x) for x in t.shape)  # GGUF lists dims fastest-first
        codes, scale, offset = _decode(t.data, kind, n, k)
        heads = permuted_heads(t.name, cfg)
        if heads:
            codes, scale, offset = (_unpermute(a, heads) for a in (codes, scale, offset))
        out[name] = Q4Blocks(*(torch.from_numpy(np.ascontiguousarray(a)) for a in (codes, scale, offset)))
    return out
