"""Paged KV cache (page size == MSA block size) and the block manager that hands out pages.

Layout per layer: K and V `[num_pages, Hkv, B, d]`; MSA layers also hold an index-key cache
`[num_pages, B, d_idx]` on the same pages. Logical block j of a request lives in physical
page `page_table[j]`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = 128
    num_pages: int = 512
    dtype: torch.dtype = torch.float32


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, cfg: CacheConfig,
                 device: torch.device, index_dim: int = 0, index_layers: tuple[int, ...] = ()):
        shape = (cfg.num_pages, num_kv_heads, cfg.page_size, head_dim)
        self.cfg = cfg
        self.k = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_layers)]
        self.k_idx: dict[int, torch.Tensor] = {
            i: torch.zeros((cfg.num_pages, cfg.page_size, index_dim), dtype=cfg.dtype, device=device)
            for i in index_layers}

    @property
    def page_size(self) -> int:
        return self.cfg.page_size

    def bytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in self.k + self.v)
        return n + sum(t.numel() * t.element_size() for t in self.k_idx.values())


class OutOfPagesError(RuntimeError):
    """No free page left; the scheduler preempts or refuses."""


class BlockManager:
    """Free-list allocator of physical pages; one page table (list of page ids) per request."""

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_needed(self, request_id: str, total_tokens: int) -> int:
        have = len(self.tables.get(request_id, ()))
        return max(0, -(-total_tokens // self.page_size) - have)

    def can_grow(self, request_id: str, total_tokens: int) -> bool:
        return self.pages_needed(request_id, total_tokens) <= len(self._free)

    def grow(self, request_id: str, total_tokens: int) -> list[int]:
        """Ensure the request owns pages for `total_tokens` tokens; return its page table."""
        need = self.pages_needed(request_id, total_tokens)
        if need > len(self._free):
            raise OutOfPagesError(f"need {need} pages, {len(self._free)} free")
        table = self.tables.setdefault(request_id, [])
        for _ in range(need):
            table.append(self._free.pop())
        return table

    def release(self, request_id: str) -> None:
        for p in reversed(self.tables.pop(request_id, [])):
            self._free.append(p)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_pages
