"""Expert-sorted, ``BLOCK_M``-aligned row order of the (token, slot) pairs, in torch ops that never read a
value on the host (CUDA-graph safe): the grouped GEMMs' gather table.

The T*k pairs ``flat = t * k + j`` are sorted by expert (stable: ascending token within an expert);
each expert's rows start a fresh block of ``BLOCK_M`` rows, its tail padded with the sentinel ``T*k``.
The buffers have a size fixed by the shapes: ``rows = T*k + min(T*k, E) * (BLOCK_M - 1)`` rounded up to
whole blocks (every non-empty expert wastes at most ``BLOCK_M - 1`` rows), so a captured graph replays
for any routing. ``block_expert[b]`` is the expert of block b, -1 past the last segment.

Expert parallel (``first_expert`` given): the ids are global and this rank holds experts
``[first_expert, first_expert + E)``; the other pairs get no row at all (their slots stay unwritten).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Alignment:
    sorted_ids: torch.Tensor  # int32 [rows]: flat pair index t*k + j, or T*k on padding rows
    block_expert: torch.Tensor  # int32 [rows / BLOCK_M]: the expert of each block, -1 past the end


def aligned_rows(pairs: int, experts: int, block_m: int) -> int:
    """Rows of the aligned buffers for ``pairs = T*k`` routed pairs: a whole number of blocks."""
    worst = pairs + min(pairs, experts) * (block_m - 1)
    return -(-worst // block_m) * block_m


def align_tokens(ids: torch.Tensor, experts: int, block_m: int, first_expert: int | None = None) -> Alignment:
    """The aligned gather table of expert ids int32 ``[T, k]``: values in ``[0, experts)``, or with
    ``first_expert`` global ids of which those in ``[first_expert, first_expert + experts)`` are kept."""
    flat = ids.reshape(-1)
    pairs, dev = flat.numel(), flat.device
    rows = aligned_rows(pairs, experts, block_m)
    if first_expert is not None:  # another rank's pairs sort last, as expert E, and get no row
        flat = flat - first_expert
        flat = torch.where((flat >= 0) & (flat < experts), flat, experts)
    sorted_e, perm = torch.sort(flat, stable=True)
    bounds = torch.arange(experts + 1, device=dev, dtype=flat.dtype)
    starts = torch.searchsorted(sorted_e, bounds)  # [E + 1] int64: first sorted pair of each expert (E: foreign)
    padded = (starts[1:] - starts[:-1] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)  # end of each expert's padded segment
    se = sorted_e.long()
    if first_expert is not None:
        seg = torch.cat([ends - padded, ends.new_full((1,), rows)])  # foreign pairs: the dump row `rows`
        dest = torch.where(se < experts, seg[se] + torch.arange(pairs, device=dev) - starts[se], rows)
    else:
        dest = (ends - padded)[se] + torch.arange(pairs, device=dev) - starts[se]
    sorted_ids = torch.full((rows + 1,), pairs, dtype=torch.int32, device=dev)  # + the dump row
    sorted_ids[dest] = perm.to(torch.int32)
    sorted_ids = sorted_ids[:rows]
    block_start = torch.arange(0, rows, block_m, device=dev)
    block_expert = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_expert < experts, block_expert, -1).to(torch.int32)
    return Alignment(sorted_ids, block_expert)
