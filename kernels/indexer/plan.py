"""Every choice of one ``msa_indexer`` call, made once: ``plan_indexer(...) -> IndexerPlan``.

The implementation follows ``resolve_impl`` (Triton on CUDA, the fp32 torch reference on CPU); the
Triton kernel takes a tile of ``128 / H`` tokens x ``H`` index heads per program (128 MMA rows, so
each key page is loaded once for the whole tile), 8 warps and 3 pipeline stages (measured on the
H200: 256-row tiles and 2 stages were no faster, see ``benchmarks/CHANGELOG.md``).

FP8 index keys (a float8_e4m3fn ``k_idx_cache``; the op checks its scales): on a GPU they need FP8
tensor cores (``kernels._common.fp8.require_fp8``). Without ``index_fp8_dot`` the kernel widens each key
page to q's dtype (exact) and scales the scores per key; with it, q is rounded to e4m3 per (token,
head) row inside the kernel and the dot is e4m3 x e4m3 (under the interpreter both operands are fp32
holding the e4m3 values: its fp32 -> fp8 cast rounds wrongly, so the rounding is emulated there).
int8 index keys (an int8 ``k_idx_cache``, ``kernels._common.int8``) always score with the exact int8 x int8 dot,
q rounded to int8 per row in the kernel (int8 tensor cores: every GPU Triton runs on here, sm80+).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from kernels._common.device import interpreting
from kernels._common.fp8 import FP8, require_fp8
from kernels._common.validate import resolve_impl

OP = "msa_indexer"
TILE_ROWS = 128  # MMA rows per program: tokens x index heads
OUTPUTS = ("ids", "block_scores", "score_sum")  # the kernel's MODE 0, 1, 2
Output = Literal["ids", "block_scores", "score_sum"]


@dataclass(frozen=True)
class IndexerPlan:
    """How the indexer runs; the launchers read it and decide nothing."""

    impl: str  # "triton" | "torch"
    output: Output  # ids [T, H, k]; block scores [T, H, max_pages] (-inf off the history); per-row score sums
    topk: int
    heads: int  # index heads H (one per KV group)
    block: int  # B, keys per page
    d_idx: int
    tile_rows: int  # MMA rows per program (a power of two)
    tokens_per_tile: int  # tile_rows // H query tokens per program
    num_warps: int
    num_stages: int
    upcast: bool  # interpreter: dot operands cast to fp32 (its bf16 dot is wrong)
    check_lengths: bool  # read the length values on the host (one sync)
    fp8_keys: bool = False  # float8_e4m3fn index keys with per-token fp32 scales
    fp8_dot: bool = False  # q rounded to e4m3 per row, e4m3 x e4m3 dot (fp8 keys only)
    int8_keys: bool = False  # int8 index keys with per-token fp32 scales: q rounded to int8 per row, int8 dot

    @property
    def scaled(self) -> bool:
        """The keys come with per-token fp32 scales (fp8 or int8)."""
        return self.fp8_keys or self.int8_keys

    @property
    def mode(self) -> int:
        return OUTPUTS.index(self.output)


def plan_indexer(q_idx: torch.Tensor, k_idx_cache: torch.Tensor, topk: int, *, impl: str = "auto",
                 output: Output = "ids", check_lengths: bool = True, index_fp8_dot: bool = False) -> IndexerPlan:
    """Plan from q_idx ``[T, H, d_idx]`` and k_idx_cache ``[pages, B, d_idx]`` (sizes, dtype, device)."""
    impl = resolve_impl(impl, q_idx.device, OP)
    fp8_keys = k_idx_cache.dtype == FP8
    int8_keys = k_idx_cache.dtype == torch.int8
    if index_fp8_dot and not fp8_keys:
        raise ValueError(f"{OP}: index_fp8_dot=True scores against float8_e4m3fn index keys, got a "
                         f"{str(k_idx_cache.dtype).replace('torch.', '')} k_idx_cache: quantize the keys "
                         "(kernels.decode.quantize_index_keys) or drop index_fp8_dot")
    if fp8_keys and impl == "triton":
        require_fp8(OP, q_idx.device)
    if impl == "triton" and q_idx.dtype == torch.float32:
        raise ValueError(f"{OP}: the Triton indexer takes bfloat16 or float16 q_idx, got float32; "
                         "use impl='torch' for fp32")
    if output not in OUTPUTS:
        raise ValueError(f"{OP}: output must be one of {OUTPUTS}, got {output!r}")
    if impl == "torch" and output != "ids":
        raise ValueError(f"{OP}: output={output!r} comes from the Triton kernel only; use impl='triton'")
    heads = q_idx.shape[1]
    return IndexerPlan(impl=impl, output=output, topk=topk, heads=heads, block=k_idx_cache.shape[1],
                       d_idx=q_idx.shape[2], tile_rows=TILE_ROWS, tokens_per_tile=TILE_ROWS // heads, num_warps=8,
                       num_stages=3, upcast=interpreting(), check_lengths=check_lengths or impl == "torch",
                       fp8_keys=fp8_keys, fp8_dot=index_fp8_dot, int8_keys=int8_keys)
