"""The FP8 KV cache in the engine (`--kv-cache-dtype fp8`): the one decision point of the cache dtype, and the
readers that turn e4m3 K/V rows plus their fp32 scales back into values (`kernels._common.fp8`'s rule:
value = x8 * scale; this module never quantises, `engine.gpu.ops.rope_cache` / `engine.kv_cache.write_kv` do).

Who reads what: the kernels (GPU decode plans, sparse prefill, the torch references of `msa-ref`) take the
scales themselves; the CPU paths and the measurement paths (oracle selection, recall, telemetry) dequantise
the rows they gather with the helpers here. A reader with no scales (bf16/fp32 caches) gets the cache as is.
"""
from __future__ import annotations

import torch

from engine.attention.meta import AttentionMeta
from engine.kv_cache import as_bytes
from kernels._common.fp8 import FP8, KV_DTYPES, dequantize_rows, require_fp8

KV_CACHE_DTYPES = KV_DTYPES  # ("auto", "bf16", "fp8", "fp8-hadamard"): the CLI's and the server's choices


def resolve_kv_dtype(choice: str, device: torch.device, auto: torch.dtype) -> torch.dtype:
    """`--kv-cache-dtype` -> the K/V storage dtype: "auto" = `auto` (the engine's own choice), "bf16",
    "fp8" and "fp8-hadamard" (e4m3 + fp32 scales; on a CUDA GPU only with FP8 tensor cores: `require_fp8`;
    `rotates_k` tells the two apart)."""
    if choice == "auto":
        return auto
    if choice == "bf16":
        return torch.bfloat16
    if choice in ("fp8", "fp8-hadamard"):
        require_fp8(f"--kv-cache-dtype {choice}", device)
        return FP8
    raise ValueError(f"unknown kv_cache_dtype {choice!r}: use one of {', '.join(KV_CACHE_DTYPES)}")


def rotates_k(choice: str) -> bool:
    """Whether `--kv-cache-dtype` stores K rotated (`fp8-hadamard`: q and K times `kernels._common.fp8.hadamard`
    after RoPE, so q . k is unchanged and each K row's e4m3 scale sees no outlier channel)."""
    return choice == "fp8-hadamard"


def check_rotation(choice: str, head_dim: int) -> None:
    """`fp8-hadamard` rotates by the Hadamard matrix of the head dim: one line unless that is a power of two."""
    if rotates_k(choice) and (head_dim < 1 or head_dim & (head_dim - 1)):
        raise ValueError(f"--kv-cache-dtype fp8-hadamard rotates by a Hadamard matrix of the head dim, which must be "
                         f"a power of two (this model's is {head_dim}); use --kv-cache-dtype fp8")


def kv_dtype_name(dtype: torch.dtype, rotated: bool = False) -> str:
    """What a run's records call the K/V storage: "fp8", "fp8-hadamard", "bf16", "fp16", "fp32"."""
    if rotated:
        return "fp8-hadamard"
    return {FP8: "fp8", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def read_rows(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Gathered cache rows `[..., d]` with their gathered scales `[...]` (None: not quantised) -> values in
    `dtype` (a cache without scales comes back as is)."""
    return x if scale is None else dequantize_rows(x, scale, dtype)


def dequant_pages(cache: torch.Tensor, scale: torch.Tensor | None, meta: AttentionMeta,
                  dtype: torch.dtype) -> torch.Tensor:
    """The cache `[P, Hkv, B, d]` as values, for the readers that index it by page themselves (oracle selection,
    recall, telemetry): without scales the cache itself; with them a zero tensor of the same shape in `dtype`
    whose pages in use by this step's requests (`meta.page_lists`) hold ``x8 * scale``. Costs a cache-sized
    allocation per call: the measurement paths only, never the attention itself."""
    if scale is None:
        return cache
    out = torch.zeros(cache.shape, dtype=dtype, device=cache.device)
    used = sorted({p for pages in meta.page_lists for p in pages})
    if used:
        idx = torch.as_tensor(used, dtype=torch.long, device=cache.device)
        out[idx] = dequantize_rows(as_bytes(cache)[idx].view(cache.dtype), scale[idx], dtype)
    return out


def refuse_fp8(what: str, supported: str, cache: torch.Tensor) -> None:
    """One line when `what` cannot read an FP8 cache (`supported`: what it can do instead)."""
    if cache.dtype == FP8:
        raise ValueError(f"{what} does not read an FP8 KV cache: {supported}")
