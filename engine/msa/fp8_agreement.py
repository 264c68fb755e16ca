"""FP8 index-key agreement on a model's own activations (issue 22): do e4m3 index keys select the blocks bf16
keys select?

`capture_index_qk` runs a prompt's prefill through an MSA `LLM` and keeps each MSA layer's index queries
`[T, Hkv, d_idx]` and index keys `[T, d_idx]` as the layer computed them (a forward hook on the layer's
`LayerIndexer`, removed afterwards). `agreement` then scores every query position and KV group with the
prefill reference's rule (`kernels.indexer.naive.select_blocks`: the top k - 1 earlier blocks by block-max
score, the own block forced) three ways: bf16 q and k (the baseline), bf16 q against dequantised fp8 keys
(`quantize_index_keys`), and the fp8-dot path (`dequantized_index_queries` against the fp8 keys).

Per variant and top-k: `agreement` = sum |sel_fp8 ∩ sel_bf16| / sum |sel_bf16| over rows (own block included,
as the selection holds it), `history` = the same over history blocks of the rows that must choose
(own block >= k: fewer candidates than slots leave nothing to choose), and `rows_differ` = the share of
(query, group) rows whose selections differ. Work: the causal triangle of fp32 products per variant
(queries tiled by their own block, as `engine.attention.cpu_indexer` does).
"""
from __future__ import annotations

import math

import torch

from kernels.decode.fp8 import dequantized_index_queries, quantize_index_keys
from kernels.indexer.naive import select_blocks

VARIANTS = ("fp8_keys", "fp8_dot")


def capture_index_qk(llm, prompt_ids: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Prefill `prompt_ids` (one token generated) through `llm` (an MSA attention) -> {layer: (q_idx fp32
    `[T, Hkv, d_idx]`, k_idx fp32 `[T, d_idx]`)} for the prompt's T tokens, chunks joined in order."""
    from engine import SamplingParams

    proj = getattr(llm.engine.attention, "proj", None)
    if proj is None:
        raise ValueError("capture_index_qk needs an LLM built with an MSA attention (attention='msa' or 'msa-ref')")
    got: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in proj.layer_ids}

    def hook(layer: int):
        def keep(_mod, _args, out):
            got[layer].append((out[0].detach().float().cpu(), out[1].detach().float().cpu()))
        return keep

    handles = [proj[i].register_forward_hook(hook(i)) for i in proj.layer_ids]
    try:
        llm.generate([list(prompt_ids)], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        for h in handles:
            h.remove()
    t = len(prompt_ids)
    return {i: (torch.cat([q for q, _ in v])[:t], torch.cat([k for _, k in v])[:t]) for i, v in got.items()}


def _block_selections(q: torch.Tensor, k: torch.Tensor, block: int, topks: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """q `[T, H, d]`, k `[T, d]` (fp32 values) -> {topk: ids `[T, H, topk]`}: the reference's rule, prefill of
    one request (query i at position i), only candidate blocks scored."""
    t, h, d = q.shape
    out = {kk: torch.empty((t, h, kk), dtype=torch.int32) for kk in topks}
    scale = 1.0 / math.sqrt(d)
    for own in range(-(-t // block)):
        a, b = own * block, min(t, (own + 1) * block)
        scores = (q[a:b].reshape(-1, d) @ k[:own * block].T).view(b - a, h, own, block).amax(-1) * scale
        local = torch.full((b - a,), own, dtype=torch.long)
        for kk in topks:
            out[kk][a:b] = select_blocks(scores, local, kk)
    return out


def _compare(ref: torch.Tensor, ids: torch.Tensor, topk: int) -> dict[str, float]:
    """Counts of one layer: hits / size of the reference selection, history hits / size on contested rows,
    differing rows, rows."""
    hit = ((ref[..., :, None] == ids[..., None, :]) & (ref[..., :, None] >= 0)).any(-1)  # [T, H, k]
    size = (ref >= 0).sum()
    contested = (ref >= 0).sum(-1) == topk  # [T, H]: every slot filled means the own block >= k - 1
    hist = hit[..., :topk - 1] & contested[..., None]
    differ = (~hit & (ref >= 0)).any(-1)  # [T, H]: a block of the reference missed
    return {"hits": float(hit.sum()), "size": float(size), "hist_hits": float(hist.sum()),
            "hist_size": float(contested.sum() * (topk - 1)), "differ": float(differ.sum()),
            "rows": float(differ.numel())}


def layer_counts(q: torch.Tensor, k: torch.Tensor, block: int = 128, topks: tuple[int, ...] = (16, 4)
                 ) -> dict[str, dict[int, dict[str, float]]]:
    """One layer's captured q `[T, H, d]`, k `[T, d]` -> {variant: {topk: counts}} against bf16 q and k."""
    qb, kb = q.to(torch.bfloat16).float(), k.to(torch.bfloat16).float()
    k8, ks = quantize_index_keys(kb)
    kd = k8.float() * ks[:, None]
    ref = _block_selections(qb, kb, block, topks)
    variants = {"fp8_keys": _block_selections(qb, kd, block, topks),
                "fp8_dot": _block_selections(dequantized_index_queries(qb), kd, block, topks)}
    return {v: {kk: _compare(ref[kk], sel[kk], kk) for kk in topks} for v, sel in variants.items()}


def summarize(counts: list[dict[str, dict[int, dict[str, float]]]]) -> dict[str, dict[int, dict[str, float]]]:
    """Counts of layers (or of layers of several prompts) -> {variant: {topk: {agreement, history, rows_differ}}}."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for v in counts[0]:
        out[v] = {}
        for kk in counts[0][v]:
            tot = {key: sum(c[v][kk][key] for c in counts) for key in counts[0][v][kk]}
            out[v][kk] = {"agreement": tot["hits"] / max(tot["size"], 1.0),
                          "history": tot["hist_hits"] / max(tot["hist_size"], 1.0),
                          "rows_differ": tot["differ"] / max(tot["rows"], 1.0)}
    return out
