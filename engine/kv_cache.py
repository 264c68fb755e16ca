"""Paged KV cache (page size == MSA block size) and the block manager that hands out pages.

Layout per layer: K and V `[num_pages, Hkv, B, d]`; MSA layers also hold an index-key cache
`[num_pages, B, d_idx]` on the same pages. Logical block j of a request lives in physical
page `page_table[j]`. One extra page (index `num_pages`, `scratch_page`) is never handed out:
padded rows of a CUDA-graph batch write their K/V there.
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
        shape = (cfg.num_pages + 1, num_kv_heads, cfg.page_size, head_dim)
        self.cfg = cfg
        self.k = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_layers)]
        self.k_idx: dict[int, torch.Tensor] = {
            i: torch.zeros((cfg.num_pages + 1, cfg.page_size, index_dim), dtype=cfg.dtype, device=device)
            for i in index_layers}

    @property
    def page_size(self) -> int:
        return self.cfg.page_size

    @property
    def scratch_page(self) -> int:
        return self.cfg.num_pages

    def bytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in self.k + self.v)
        return n + sum(t.numel() * t.element_size() for t in self.k_idx.values())


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                    index_dim: int = 0, num_index_layers: int = 0) -> int:
    """Cache bytes one token takes over all layers (K, V and the MSA index keys)."""
    size = torch.empty((), dtype=dtype).element_size()
    return size * (2 * num_layers * num_kv_heads * head_dim + num_index_layers * index_dim)


def tokens_for_free_memory(per_token: int, device: torch.device, fraction: float = 0.9,
                           reserve_bytes: int = 2 << 30) -> int:
    """KV tokens that fit in `fraction` of the device's free memory minus `reserve_bytes` (activations,
    graph pools, workspaces): how the GPU cache is sized when no size is given."""
    if not 0 < fraction <= 1:
        raise ValueError(f"gpu_memory_fraction must be in (0, 1], got {fraction}")
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, int(free * fraction) - reserve_bytes) // per_token


class OutOfPagesError(RuntimeError):
    """No free page left; the scheduler preempts or refuses."""


class BlockManager:
    """Free-list allocator of physical pages; one page table (list of page ids) per request."""

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}
        self._tensors: dict[str, torch.Tensor] = {}

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
        if need:
            self._tensors.pop(request_id, None)
        return table

    def table_tensor(self, request_id: str) -> torch.Tensor:
        """The request's page table as int32 `[pages]` (CPU), cached until it grows."""
        t = self._tensors.get(request_id)
        if t is None:
            t = self._tensors[request_id] = torch.tensor(self.tables[request_id], dtype=torch.int32)
        return t

    def release(self, request_id: str) -> None:
        self._tensors.pop(request_id, None)
        for p in reversed(self.tables.pop(request_id, [])):
            self._free.append(p)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_pages
