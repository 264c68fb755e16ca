"""Batched sampling: every greedy row in one argmax on the logits' device and one host copy;
rows with temperature > 0 go through `engine.sampling.sample` (top-k / top-p on the device, the
draw on the CPU with the request's seeded generator, so seeds reproduce on every device)."""
from __future__ import annotations

import torch

from engine.sampling import SamplingParams, sample


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None]) -> list[int]:
    """logits `[n, vocab]` fp32 -> n token ids."""
    if logits.shape[0] != len(params):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(params)} requests")
    greedy = [i for i, p in enumerate(params) if p.temperature == 0.0]
    out: list[int] = [0] * len(params)
    if greedy:
        rows = logits if len(greedy) == len(params) else logits[greedy]
        for i, t in zip(greedy, rows.argmax(dim=-1).tolist()):
            out[i] = t
    for i, p in enumerate(params):
        if p.temperature != 0.0:
            out[i] = sample(logits[i], p, generators[i])
    return out
