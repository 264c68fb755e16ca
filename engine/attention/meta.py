"""Per-step batch metadata shared by every layer's attention."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMeta:
    """A packed batch of R requests, each contributing q_len_r query tokens this step.

    `cu_seqlens_q` int32 `[R+1]`, `seq_lens_kv` int32 `[R]` (KV length including this step's
    tokens), `page_table` int32 `[R, max_pages]` (-1 unused), `slot_pages`/`slot_offsets`
    int64 `[T]` (where each new token's K/V is written). Python copies of the lengths are kept
    so the CPU path never syncs.
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

    @property
    def num_requests(self) -> int:
        return len(self.q_lens)
