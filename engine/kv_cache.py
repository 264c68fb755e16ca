"""Paged KV cache (page size == MSA block size) and the block manager that hands out pages.

Layout per layer: K and V `[num_pages, Hkv, B, d]`; MSA layers also hold an index-key cache
`[num_pages, B, d_idx]` on the same pages. Logical block j of a request lives in physical
page `page_table[j]`. An FP8 cache (`CacheConfig.dtype` torch.float8_e4m3fn, `--kv-cache-dtype fp8`) holds K and
V as e4m3 codes in the same layout plus fp32 scales `k_scale`, `v_scale` `[num_pages, Hkv, B]` per layer (one per
token and KV head, the rule of `kernels._common.fp8`) and its index keys as int8 codes plus an fp32 scale
`k_idx_scale` `[num_pages, B]` per token (`kernels._common.int8`: the same bytes as e4m3 keys, selections closer to
bf16's; `index_key_dtype` decides).
One extra page (index `num_pages`, `scratch_page`) is never handed out:
padded rows of a CUDA-graph batch write their K/V there.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._common.fp8 import FP8, hadamard, quantize_rows
from kernels._common.int8 import INT8, quantize_int8_rows


def index_key_dtype(kv_dtype: torch.dtype, model_dtype: torch.dtype | None) -> torch.dtype:
    """The one decision on the index keys' storage: int8 (+ fp32 scale per token) beside an FP8 K/V cache, else
    the model dtype (None: `kv_dtype`)."""
    if kv_dtype == FP8:
        if model_dtype is None:
            raise ValueError("an FP8 KV cache needs CacheConfig.model_dtype (the dtype of q and the index queries)")
        return INT8
    return model_dtype or kv_dtype


@dataclass(frozen=True)
class CacheConfig:
    """`dtype`: of K and V (torch.float8_e4m3fn: e4m3 codes + fp32 scales); `model_dtype`: of the queries, the
    index queries and (beside a bf16/fp16/fp32 cache) the index keys (None: `dtype`; an FP8 cache needs it);
    `rotate_k` (FP8 only, `--kv-cache-dtype fp8-hadamard`): the layers store K, and attend with q, both multiplied
    by `KVCache.k_rotation` after RoPE."""

    page_size: int = 128
    num_pages: int = 512
    dtype: torch.dtype = torch.float32
    model_dtype: torch.dtype | None = None
    rotate_k: bool = False

    def __post_init__(self) -> None:
        if self.rotate_k and self.dtype != FP8:
            raise ValueError(f"rotate_k goes with an fp8 cache (--kv-cache-dtype fp8-hadamard), not {self.dtype}")

    @property
    def quantized(self) -> bool:
        return self.dtype == FP8

    @property
    def index_dtype(self) -> torch.dtype:
        """Of the index-key cache (`index_key_dtype`)."""
        return index_key_dtype(self.dtype, self.model_dtype)

    @property
    def index_query_dtype(self) -> torch.dtype:
        """What the index queries are cast to before the indexers."""
        return self.model_dtype or self.dtype


class KVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, cfg: CacheConfig,
                 device: torch.device, index_dim: int = 0, index_layers: tuple[int, ...] = ()):
        shape = (cfg.num_pages + 1, num_kv_heads, cfg.page_size, head_dim)
        self.cfg = cfg
        self.k = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(num_layers)]
        self.quantized = cfg.quantized
        # fp8-hadamard: q and K times this orthonormal [d, d] matrix after RoPE (q . k unchanged), else None
        self.k_rotation = hadamard(head_dim, device) if cfg.rotate_k else None
        n_scaled = num_layers if self.quantized else 0
        self.k_scale = [torch.zeros(shape[:3], dtype=torch.float32, device=device) for _ in range(n_scaled)]
        self.v_scale = [torch.zeros(shape[:3], dtype=torch.float32, device=device) for _ in range(n_scaled)]
        self.k_idx: dict[int, torch.Tensor] = {
            i: torch.zeros((cfg.num_pages + 1, cfg.page_size, index_dim), dtype=cfg.index_dtype, device=device)
            for i in index_layers}
        self.k_idx_scale: dict[int, torch.Tensor] = {  # int8 index keys: one fp32 scale per token
            i: torch.zeros((cfg.num_pages + 1, cfg.page_size), dtype=torch.float32, device=device)
            for i in (index_layers if index_layers and cfg.index_dtype == INT8 else ())}

    def index_scale(self, layer: int) -> torch.Tensor | None:
        """The fp32 per-token scales `[num_pages + 1, B]` of `layer`'s int8 index keys, else None."""
        return self.k_idx_scale.get(layer)

    def write_index_keys(self, layer: int, pages: torch.Tensor, offsets: torch.Tensor, k_idx: torch.Tensor) -> None:
        """Write `layer`'s index keys `[T, d_idx]` at (`pages`, `offsets`) `[T]`: int8 codes and their scales
        (quantised from `k_idx` as given), or cast to the cache's dtype."""
        kic = self.k_idx[layer]
        scale = self.k_idx_scale.get(layer)
        if scale is None:
            kic[pages, offsets] = k_idx.to(kic.dtype)
            return
        k8, s = quantize_int8_rows(k_idx)
        kic[pages, offsets], scale[pages, offsets] = k8, s

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(k_scale, v_scale) of `layer`: fp32 `[num_pages + 1, Hkv, B]` for an FP8 cache, else (None, None)."""
        if not self.quantized:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    @property
    def page_size(self) -> int:
        return self.cfg.page_size

    @property
    def scratch_page(self) -> int:
        return self.cfg.num_pages

    def bytes(self) -> int:
        n = sum(t.numel() * t.element_size() for t in self.k + self.v + self.k_scale + self.v_scale)
        return n + sum(t.numel() * t.element_size() for t in [*self.k_idx.values(), *self.k_idx_scale.values()])


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                    index_dim: int = 0, num_index_layers: int = 0, index_dtype: torch.dtype | None = None) -> int:
    """Cache bytes one token takes over all layers (K, V, their fp32 scales when `dtype` is FP8, and the MSA
    index keys in `index_dtype`, default `dtype`, with their fp32 scale when int8)."""
    size = torch.empty((), dtype=dtype).element_size()
    idtype = index_dtype or dtype
    isize = torch.empty((), dtype=idtype).element_size()
    scales = 2 * 4 if dtype == FP8 else 0  # one fp32 scale per token and KV head, for K and for V
    iscale = 4 if idtype == INT8 else 0  # one fp32 scale per token and index layer
    return 2 * num_layers * num_kv_heads * (size * head_dim) + num_layers * num_kv_heads * scales \
        + num_index_layers * (isize * index_dim + iscale)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """An e4m3 tensor viewed as uint8 (same storage), anything else as is: gathers and scatters move FP8 codes
    as bytes, so they never depend on an indexing kernel having an fp8 variant (the CPU's `index_copy_` has none)."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def rotate_qk(q: torch.Tensor, k: torch.Tensor, rotation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8-hadamard (`KVCache.k_rotation`): q `[T, Hq, d]` and k `[T, Hkv, d]` times the rotation after RoPE, in
    fp32; q back in its dtype, k left in fp32 so `write_kv` quantises the unrounded product."""
    return (q.float() @ rotation).to(q.dtype), k.float() @ rotation


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None,
             v_scale: torch.Tensor | None, pages: torch.Tensor, offsets: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """Write k, v `[T, Hkv, d]` at (`pages`, `offsets`) `[T]`; an FP8 cache gets e4m3 codes and their scales
    (`quantize_rows`, from k/v as given: pass them in fp32 to quantise unrounded values)."""
    if k_scale is None or v_scale is None:
        k_cache[pages, :, offsets] = k.to(k_cache.dtype)
        v_cache[pages, :, offsets] = v.to(v_cache.dtype)
        return
    k8, ks = quantize_rows(k)
    v8, vs = quantize_rows(v)
    as_bytes(k_cache)[pages, :, offsets], k_scale[pages, :, offsets] = as_bytes(k8), ks
    as_bytes(v_cache)[pages, :, offsets], v_scale[pages, :, offsets] = as_bytes(v8), vs


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
