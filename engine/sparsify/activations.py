"""Run the frozen backbone once over the calibration sequences and keep, for every MSA layer, the
normed hidden state that feeds the index projections (float16 on the CPU, `[n_seq, S, hidden]`).

The backbone is frozen, so each layer's indexer can then be trained alone from these cached
inputs; the main attention's q/k (the teacher) are recomputed from them with the layer's own
frozen projections and RoPE (`main_qk`).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.sampling import SamplingParams
from engine.scheduler import ScheduledChunk
from engine.sequence import Sequence


class _RecordingAttention:
    """Dense attention (the dense LLM's own) that keeps the `hidden` input of the chosen layers."""

    def __init__(self, dense, layers: set[int]):
        self.dense, self.layers = dense, layers
        self.kept: dict[int, list[torch.Tensor]] = {i: [] for i in layers}

    def __call__(self, layer, q, k_cache, v_cache, meta, *, hidden, k_scale=None, v_scale=None, **_):
        if layer in self.layers:
            self.kept[layer].append(hidden.detach().to("cpu", torch.float16))
        return self.dense(layer, q, k_cache, v_cache, meta, k_scale=k_scale, v_scale=v_scale)  # FP8: its scales


@torch.inference_mode()
def collect_hidden(llm, seqs: list[list[int]], layers: tuple[int, ...],
                   on_seq: Callable[[int], None] | None = None) -> dict[int, torch.Tensor]:
    """Hidden inputs `{layer: [n_seq, S, hidden] fp16}` of `llm` (dense) over token sequences."""
    eng = llm.engine
    rec = _RecordingAttention(llm.engine.attention, set(layers))
    out: dict[int, list[torch.Tensor]] = {i: [] for i in layers}
    for n, ids in enumerate(seqs):
        rid = f"sparsify-{n}"
        seq = Sequence(rid, list(ids), SamplingParams(max_tokens=1), max_len=len(ids))
        eng.blocks.grow(rid, len(ids))
        try:
            step = eng.scheduler.cfg.max_num_batched_tokens
            for start in range(0, len(ids), step):
                c = ScheduledChunk(seq, start, min(step, len(ids) - start))
                x, pos, meta = eng._pack([c])
                llm.model.hidden_states(x, pos, meta, llm.cache, rec)
                seq.num_computed += c.length
        finally:
            eng.blocks.release(rid)
        for i in layers:
            out[i].append(torch.cat(rec.kept[i]))
            rec.kept[i].clear()
        if on_seq:
            on_seq(n)
    return {i: torch.stack(v) for i, v in out.items()}


@torch.no_grad()
def main_qk(model, layer: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The main attention's post-RoPE q `[S, Hq, d]` and k `[S, Hkv, d]` (fp32) of one sequence's
    cached hidden input `h [S, hidden]`, with the layer's frozen weights."""
    L = model.layers[layer]
    dev, dt = L.qkv.device, L.qkv.dtype
    pos = torch.arange(h.shape[0], device=dev)
    cos, sin = model.rope(pos)
    q, k, _ = L.qkv_proj(h.to(dev, dt), cos, sin)
    return q.float(), k.float()
