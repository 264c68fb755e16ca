"""Per-step batch metadata shared by every layer's attention, the decode-plan hook, and what an
attention object is (`Attention`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch


class DecodeShapes(NamedTuple):
    """What an attention needs to build its decode plans (given once per step to `plan_decode`)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype  # of the queries (and of a bf16/fp16 cache)
    device: torch.device
    kv_dtype: torch.dtype | None = None  # of the K/V cache when it differs (torch.float8_e4m3fn), else None
    index_dtype: torch.dtype | None = None  # of the index-key cache when it differs (torch.int8), else None


@dataclass
class AttentionMeta:
    """A packed batch of R requests, each contributing q_len_r query tokens this step.

    `cu_seqlens_q` int32 `[R+1]`, `seq_lens_kv` int32 `[R]` (KV length including this step's
    tokens), `page_table` int32 `[R, max_pages]` (-1 unused), `slot_pages`/`slot_offsets`
    int64 `[T]` (where each new token's K/V is written). Python copies of the lengths are kept
    so the CPU path never syncs; `seq_lens_host` / `page_table_host` are CPU int32 copies of
    the two tensors (decode plans validate and copy them without a device sync).

    Decode-plan hook (GPU; on the CPU `DenseAttention` builds a `CpuDecodePlan`): an attention
    object may define `plan_decode(meta, shapes, key)`. The engine calls it once per decode step,
    outside any CUDA-graph capture; it fills the plan's buffers from the host copies and sets
    `meta.decode_plan` (or anything it needs) for its layer calls. `key` names the plan: a
    captured batch size, or "eager". An attention that also sets `supports_cuda_graphs = True`
    promises its layer call is capturable given that hook (no host syncs, no allocation that
    depends on values); the engine then replays decode steps from CUDA graphs, with rows padded to
    the captured size (padded rows: seq_len 1 on the scratch page).
    """

    cu_seqlens_q: torch.Tensor
    seq_lens_kv: torch.Tensor
    page_table: torch.Tensor
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor
    q_lens: list[int]
    kv_lens: list[int]
    page_lists: list[list[int]]
    is_decode: bool = False  # every request has exactly one new token... or q_len new draft tokens
    # MSA statistics (filled by MSA layers when asked): keys read / dense keys, per request
    stats: dict[str, list[float]] = field(default_factory=dict)
    seq_lens_host: torch.Tensor | None = None
    page_table_host: torch.Tensor | None = None
    decode_plan: Any = None  # set by the attention's plan_decode (GPU decode steps)
    in_graph: bool = False  # this forward is captured / replayed as a CUDA graph
    # CPU: flat cache row of each (token, KV head) (`engine.cpu_decode.cache_rows`), set once per forward
    cache_rows: torch.Tensor | None = None
    # selection telemetry: per request its `engine.msa.telemetry.SelectionTelemetry` or None (set by the engine),
    # and the rows its MSA layers measured at once, handed over after the forward's last MSA layer
    telemetry: list[Any] | None = None
    telemetry_pending: list[Any] = field(default_factory=list)

    @property
    def num_requests(self) -> int:
        return len(self.q_lens)


class Attention(Protocol):
    """What every layer calls: `attn(layer, q, k_cache, v_cache, meta, hidden=, cos=, sin=, cache=,
    positions=, k_scale=, v_scale=) -> out [T, Hq, d]` (`k_scale`/`v_scale`: the layer's fp32 scales
    `[P, Hkv, B]` of an FP8 cache, else None). Optional: `plan_decode(meta, shapes, key)` (the decode-plan hook
    above) and `decode_stats(meta)`."""

    supports_cuda_graphs: bool

    def __call__(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMeta, **kw: Any) -> torch.Tensor: ...
