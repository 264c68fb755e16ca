"""What rank 0 sends the other ranks per forward: the token ids, the positions and the `AttentionMeta`
fields as built by `engine.packing` (tensors on the CPU; each rank moves them to its device), and whether
rank 0 planned the decode step (then every rank plans its own, for its local heads). Per-forward state
that each rank computes itself (statistics, the decode plan, CPU cache rows) is not sent."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from engine.attention.meta import AttentionMeta

LOCAL_FIELDS = frozenset({"stats", "decode_plan", "in_graph", "cache_rows"})  # each rank's own
HOST_FIELDS = frozenset({"seq_lens_host", "page_table_host"})  # stay on the CPU


@dataclass(frozen=True)
class Step:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: dict[str, Any]
    planned: bool


def _cpu(v: Any) -> Any:
    return v.cpu() if isinstance(v, torch.Tensor) else v


def pack_step(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta) -> Step:
    sent = {f.name: _cpu(getattr(meta, f.name)) for f in fields(meta) if f.name not in LOCAL_FIELDS}
    return Step(input_ids.cpu(), positions.cpu(), sent, meta.decode_plan is not None)


def unpack_step(step: Step, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionMeta]:
    def place(name: str, v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) and name not in HOST_FIELDS else v

    meta = AttentionMeta(**{k: place(k, v) for k, v in step.meta.items()})
    return step.input_ids.to(device), step.positions.to(device), meta
