"""``impl`` resolution and split-count heuristics shared by the decode plans and plain functions.

Split counts depend only on sizes (number of requests, q_len, heads, page-table width, top-k) and on
the device's multiprocessor count, never on sequence lengths, so a CUDA graph captured once replays
for any lengths that fit the page table.
"""
from __future__ import annotations

from typing import Literal

import torch
from kernels._common.validate import resolve_impl as _resolve_impl

Impl = Literal["auto", "triton", "torch"]
MAX_INDEXER_SPLITS = 128  # merge width = splits * next_pow2(k - 1) candidates per row
PROGRAMS_PER_SM = 4
# Launch knobs measured on an H200 at 128K, q_len 1 (benchmarks/decode/RESULTS.md, run 3):
# sparse attention: ~2 programs per SM and 3 pipeline stages (batch 32: 48.6 -> 40.6 us, batch 64:
# 80.7 -> 68.1 us); indexer: 2 pages per loop iteration with bf16 keys (3.36 -> 3.62 TB/s at batch 64),
# and with fp8 keys on the fp16-convert path; the fp8 x fp8 dot is fastest one page at a time.
SPARSE_PROGRAMS_PER_SM = 2  # target (token, group, split) programs per SM of the sparse attention
SPARSE_STAGES = 3
INDEXER_BF16 = dict(pages_per_iter=2, num_warps=4)  # num_stages: launch_indexer picks it from the bytes
INDEXER_FP8 = dict(pages_per_iter=2, num_warps=4)
INDEXER_FP8_DOT = dict(pages_per_iter=1, num_warps=4)


def resolve_impl(impl: str, device: torch.device) -> str:
    """"auto" -> Triton on CUDA tensors, torch reference otherwise (the kernels' one rule)."""
    return _resolve_impl(impl, device, "decode")


def target_programs(device: torch.device) -> int:
    """About four resident programs per multiprocessor on a GPU; a handful under the interpreter."""
    if device.type == "cuda":
        return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def sparse_splits(tokens: int, num_kv_heads: int, topk: int, device: torch.device) -> int:
    """Splits of the k selected pages: fill the GPU when T * Hkv programs alone would not."""
    target = target_programs(device) * SPARSE_PROGRAMS_PER_SM // PROGRAMS_PER_SM
    return max(1, min(topk, _pow2_floor(target // (tokens * num_kv_heads))))


def sparse_tuning() -> dict:
    """Launch knobs of the sparse decode attention kernel."""
    return dict(num_warps=4, num_stages=SPARSE_STAGES)


def indexer_tuning(fp8_keys: bool, fp8_dot: bool = False) -> dict:
    """Launch knobs of the decode indexer's split kernel: pages scored per loop iteration, warps."""
    if fp8_keys:
        return dict(INDEXER_FP8_DOT if fp8_dot else INDEXER_FP8)
    return dict(INDEXER_BF16)


def dense_splits(work_items: int, max_pages: int, device: torch.device) -> int:
    """Splits of the page range for work_items = R * row_blocks * Hkv programs."""
    return max(1, min(max_pages, _pow2_floor(target_programs(device) // work_items)))


def indexer_splits(num_req: int, max_pages: int, device: torch.device) -> int:
    """Splits of the history pages of a request, so that batch 1 still fills the GPU."""
    return max(1, min(MAX_INDEXER_SPLITS, max_pages, _pow2_floor(target_programs(device) // num_req)))


def in_graph_capture() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
