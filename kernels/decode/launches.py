"""The launch records a decode plan fills and the Triton launchers read (grids, rows, warps, stages):
plain data, so the kernel files and the plan both import it and neither imports the other."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionLaunch:
    """Split-K attention: grid (tokens or R * row_blocks, Hkv, splits); splits > 1 adds the LSE merge."""

    splits: int
    rows: int  # query rows per program (a power of two >= 16)
    row_blocks: int  # dense: row blocks per (request, KV group); sparse: 1
    num_warps: int
    num_stages: int
    dot_fp32: bool  # interpreter: dot operands upcast to fp32
    precision: str
    kv_fp8: bool = False  # float8_e4m3fn K/V with per-token fp32 scales
    fp8_dot: bool = False  # fp8 K/V: e4m3 x e4m3 QK and PV dots (q, p rounded in the kernel); else widened to fp16


@dataclass(frozen=True)
class IndexerLaunch:
    """Decode indexer: grid (R, splits), then the merge over (T, Hkv)."""

    splits: int
    rows: int  # q_len * Hkv query rows per program, padded to a power of two >= 16
    keep: int  # workspace slots per row and split: next_pow2(k - 1)
    pages_per_iter: int
    num_warps: int
    num_stages: int
    fp8_keys: bool
    fp8_dot: bool  # e4m3 x e4m3 dot, queries rounded to e4m3 per row inside the kernel
    int8_keys: bool  # int8 keys with per-token scales: int8 x int8 dot, queries rounded to int8 per row
    dot_fp32: bool
    precision: str
