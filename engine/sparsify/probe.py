"""Needle probe: at given query positions of one sequence, does an indexer select the blocks that
hold a known span (the needle), and how much dense attention mass does each head put there?

Used to compare indexers without generating (the needle probe, benchmarks/CHANGELOG.md): a
retrieval head that reads the needle (mass on the span's own tokens, not the whole block: block 0
also holds the attention sink) loses it when its KV group's selection misses the needle's
block, whatever the average mass recall says.

Shapes (one sequence of S tokens, Q probed positions `pos [Q]`): main q `[Q, Hq, d]` (post-RoPE),
k `[S, Hkv, d]`; index q_idx `[Q, Hkv, d_idx]`, k_idx `[S, d_idx]`; `span = (start, end)` token
range of the needle (end exclusive). The selection rule is the training one (`objective.select_blocks`:
top k-1 history blocks by block-max index score plus the own block), the same rule as the kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sparsify import objective as obj


@dataclass
class ProbeResult:
    hit: torch.Tensor  # bool [Q, Hkv]: every block of the span is selected by the group
    needle_mass: torch.Tensor  # fp32 [Q, Hkv, G]: each head's dense softmax mass on the span's tokens
    selected_mass: torch.Tensor  # fp32 [Q, Hkv, G]: each head's dense mass inside the group's selection


def span_blocks(span: tuple[int, int], block: int) -> torch.Tensor:
    """Block ids `[n]` that the token range [start, end) touches."""
    start, end = span
    if not 0 <= start < end:
        raise ValueError(f"needle span {span} must satisfy 0 <= start < end")
    return torch.arange(start // block, (end - 1) // block + 1)


def block_hits(selected: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """selected bool `[Q, H, nb]`, blocks `[n]` -> bool `[Q, H]`: all of `blocks` are selected."""
    if blocks.numel() == 0:
        raise ValueError("no needle blocks given")
    if int(blocks.max()) >= selected.shape[-1]:
        raise ValueError(f"needle block {int(blocks.max())} lies past the sequence ({selected.shape[-1]} blocks)")
    return selected[..., blocks.to(selected.device)].all(-1)


def probe(q: torch.Tensor, k: torch.Tensor, q_idx: torch.Tensor | None, k_idx: torch.Tensor | None,
          pos: torch.Tensor, span: tuple[int, int], block: int, topk: int) -> ProbeResult:
    """Hits and masses of one indexer at positions `pos` (all after the span); `q_idx=None`: the
    oracle selection (top blocks by the group's mean dense mass), an upper bound for any indexer."""
    if int(pos.min()) < span[1]:
        raise ValueError(f"probed positions must come after the needle span {span}")
    blocks = span_blocks(span, block).to(pos.device)
    t = obj.head_logits(q, k, pos)  # [Q, Hkv, G, S]
    p = torch.softmax(t, dim=-1)
    S = k.shape[0]
    if q_idx is None:  # oracle: the blocks holding the most group-mean dense mass
        nb = -(-S // block)
        pm = torch.nn.functional.pad(p.mean(2), (0, nb * block - S))
        sel = obj.select_top_blocks(pm.view(*pm.shape[:2], nb, block).sum(-1), pos, block, topk)
    else:
        sel = obj.select_blocks(obj.index_logits(q_idx, k_idx, pos), pos, block, topk)  # [Q, Hkv, nb]
    in_needle = torch.zeros(S, dtype=torch.bool, device=pos.device)
    in_needle[span[0]:span[1]] = True
    support = obj.expand_blocks(sel, block, S)
    return ProbeResult(hit=block_hits(sel, blocks),
                       needle_mass=(p * in_needle).sum(-1),
                       selected_mass=(p * support[:, :, None, :]).sum(-1))
