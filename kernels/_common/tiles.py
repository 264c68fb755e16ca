"""Per-token and per-tile metadata for varlen launches, built on the device without a host sync.

A tile is up to ``tile_q`` consecutive query tokens of ONE request (tiles never straddle requests,
because the tokens of a tile share one page table row). The grid is sized from shapes alone:
``ceil(T / tile_q) + R`` programs bound the tile count; surplus programs see ``tile_req == -1``.
"""
from __future__ import annotations

import torch


def token_requests(cu_seqlens_q: torch.Tensor, total_q: int) -> torch.Tensor:
    """int32 ``[T]``: the request index of every packed query token."""
    ar = torch.arange(total_q, device=cu_seqlens_q.device, dtype=cu_seqlens_q.dtype)
    return torch.searchsorted(cu_seqlens_q[1:].contiguous(), ar, right=True).to(torch.int32)


def tile_table(cu_seqlens_q: torch.Tensor, total_q: int, tile_q: int,
               longest_first: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(tile_req, tile_start)`` int32 ``[max_tiles]`` (start = global token index).

    With ``longest_first`` the tiles come in reverse order, so the late tiles of each request,
    which scan the most blocks, are scheduled first (causal load balance).
    """
    dev = cu_seqlens_q.device
    n_req = cu_seqlens_q.shape[0] - 1
    max_tiles = -(-total_q // tile_q) + n_req
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    per_req = (q_lens + tile_q - 1) // tile_q
    cum = torch.zeros(n_req + 1, dtype=torch.long, device=dev)
    cum[1:] = torch.cumsum(per_req, 0)
    tiles = torch.arange(max_tiles, device=dev)
    req = torch.searchsorted(cum[1:].contiguous(), tiles, right=True)
    in_range = req < n_req
    req_c = req.clamp(max=max(n_req - 1, 0))
    start = cu_seqlens_q.long()[req_c] + (tiles - cum[req_c]) * tile_q
    tile_req = torch.where(in_range, req_c, torch.full_like(req_c, -1)).to(torch.int32)
    tile_start = torch.where(in_range, start, torch.zeros_like(start)).to(torch.int32)
    if longest_first:
        # flip the valid prefix only, so surplus (-1) programs stay at the end
        n_valid = in_range.sum()
        order = torch.where(in_range, n_valid - 1 - tiles, tiles)
        tile_req, tile_start = tile_req[order], tile_start[order]
    return tile_req.contiguous(), tile_start.contiguous()
