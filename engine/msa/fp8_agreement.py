"""FP8 index-key agreement on a model's own activations (issue 22): do e4m3 index keys select the blocks bf16
keys select?

`capture_index_qk` runs a prompt's prefill through an MSA `LLM` and keeps each MSA layer's index queries
`[T, Hkv, d_idx]` and index keys `[T, d_idx]` as the layer computed them (a forward hook on the layer's
`LayerIndexer`, removed afterwards; the captured values stay in fp32 on the LLM's device). `layer_counts` then
selects, for every query position and KV group, with the prefill reference's rule
(`kernels.indexer.naive.select_blocks`: the top k - 1 earlier blocks by block-max score, ties to the smaller id,
the own block forced) from bf16-rounded q and k (the baseline: what a bf16 engine holds) and from each variant:

* `fp32`: the captured values unrounded (on a CPU fp32 engine: the disagreement bf16 itself causes; on a bf16
  engine it equals the baseline);
* `fp8_keys`: bf16 q against e4m3 keys with one fp32 scale per token (`quantize_index_keys`, the shared rule
  of `kernels._common.fp8`), what `msa_indexer(..., k_idx_scale=...)` and the decode indexer score;
* `fp8_dot`: the fp8 x fp8 dot: q also rounded to e4m3 per (token, head) row (`dequantized_index_queries`);
* `fp8_keys_g32` / `fp8_dot_g32` (not in the default list): one scale per 32-dim sub-block of each key (and
  query) instead of per token: a finer scale, for the issue's "below that, a finer scale" question;
* `fp8_keys_had` / `fp8_dot_had` (not in the default list): q and k rotated by one orthonormal Hadamard matrix
  before e4m3 (q . k unchanged; outlier dims spread over all dims);
* `int8_dot`: the same bytes in int8 (`kernels._common.int8`: one fp32 scale per key token, q rounded to int8 per
  (token, head) row), what the decode indexer scores with `index_dtype=torch.int8`; `int8_keys` (not in the
  default list): bf16 q against int8 keys.

Per variant and top-k, counts summed over layers (and prompts, by `summarize`): `agreement` = sum |sel ∩ sel_bf16|
/ sum |sel_bf16| over every row (own block included, as the selection holds it; early rows with fewer
candidates than slots agree trivially); `history` = the same over the history slots of the rows that must
choose (own block id >= k, more candidates than the k - 1 history slots); `rows_differ` = the share of those
rows whose selection differs from the baseline. `history` and `rows_differ` are None when no row must choose
(prompts of at most k blocks). Work: the causal triangle of fp32 products per variant (queries tiled by their own
block, as `engine.attention.cpu_indexer` does).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from kernels._common.fp8 import dequantize_rows, hadamard, quantize_rows
from kernels._common.int8 import dequantize_int8_rows, dequantized_int8_queries, quantize_int8_rows
from kernels.decode.fp8 import dequantized_index_queries, quantize_index_keys
from kernels.indexer.naive import select_blocks

Counts = dict[str, float]
LayerCounts = dict[str, dict[int, Counts]]


def _fp8_keys(k: torch.Tensor) -> torch.Tensor:
    return dequantize_rows(*quantize_index_keys(k))


def _int8_keys(k: torch.Tensor) -> torch.Tensor:
    return dequantize_int8_rows(*quantize_int8_rows(k))


def _fp8_groups(x: torch.Tensor, width: int) -> torch.Tensor:
    """e4m3 with one fp32 scale per ``width`` consecutive dims of the last axis, dequantised (fp32)."""
    d = x.shape[-1]
    if d % width:
        raise ValueError(f"a {width}-dim scale group needs d_idx divisible by {width}, got {d}")
    g = x.reshape(*x.shape[:-1], d // width, width)
    return dequantize_rows(*quantize_rows(g)).reshape(x.shape)


def _rotated(x: torch.Tensor) -> torch.Tensor:
    return x @ hadamard(x.shape[-1], x.device)


# variant -> (q, k) in fp32 from the captured fp32 values (q_raw, k_raw) and their bf16 roundings (qb, kb)
_Make = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
VARIANT_INPUTS: dict[str, _Make] = {
    "fp32": lambda q, k, qb, kb: (q, k),
    "fp8_keys": lambda q, k, qb, kb: (qb, _fp8_keys(kb)),
    "fp8_dot": lambda q, k, qb, kb: (dequantized_index_queries(qb), _fp8_keys(kb)),
    "fp8_keys_g32": lambda q, k, qb, kb: (qb, _fp8_groups(kb, 32)),
    "fp8_dot_g32": lambda q, k, qb, kb: (_fp8_groups(qb, 32), _fp8_groups(kb, 32)),
    # q and k rotated by one orthonormal Hadamard matrix before e4m3 (q . k unchanged): outlier dims spread
    "fp8_keys_had": lambda q, k, qb, kb: (_rotated(qb), _fp8_keys(_rotated(kb))),
    "fp8_dot_had": lambda q, k, qb, kb: (dequantized_index_queries(_rotated(qb)), _fp8_keys(_rotated(kb))),
    "int8_keys": lambda q, k, qb, kb: (qb, _int8_keys(kb)),
    "int8_dot": lambda q, k, qb, kb: (dequantized_int8_queries(qb), _int8_keys(kb)),
}
VARIANTS = ("fp32", "fp8_keys", "fp8_dot", "int8_dot")  # the default report
FINER = ("fp8_keys_g32", "fp8_dot_g32", "fp8_keys_had", "fp8_dot_had", "int8_keys")


def capture_index_qk(llm, prompt_ids: Sequence[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Prefill `prompt_ids` (one token generated, greedy) through `llm` (an MSA attention) -> {layer: (q_idx fp32
    `[T, Hkv, d_idx]`, k_idx fp32 `[T, d_idx]`)} for the prompt's T tokens, prefill chunks joined in order."""
    from engine import SamplingParams

    proj = getattr(llm.engine.attention, "proj", None)
    if proj is None:
        raise ValueError("capture_index_qk needs an LLM built with an MSA attention (attention='msa' or 'msa-ref')")
    t = len(prompt_ids)
    if t + 1 > llm.max_model_len:
        raise ValueError(f"capture_index_qk: a {t}-token prompt plus one generated token exceeds the model's "
                         f"context {llm.max_model_len}; pass at most {llm.max_model_len - 1} tokens")
    got: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in proj.layer_ids}

    def hook(layer: int):
        def keep(_mod, _args, out):
            got[layer].append((out[0].detach().float(), out[1].detach().float()))
        return keep

    handles = [proj[i].register_forward_hook(hook(i)) for i in proj.layer_ids]
    try:
        llm.generate([list(prompt_ids)], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        for h in handles:
            h.remove()
    out = {}
    for i, parts in got.items():
        q, k = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        if q.shape[0] < t:  # a prefix served from a cache would leave its tokens out
            raise ValueError(f"capture_index_qk: layer {i} computed {q.shape[0]} of the prompt's {t} tokens; "
                             "use a fresh LLM (no cached prefix) for the capture")
        out[i] = (q[:t], k[:t])
    return out


def block_selections(q: torch.Tensor, k: torch.Tensor, block: int, topks: Sequence[int]) -> dict[int, torch.Tensor]:
    """q `[T, H, d]`, k `[T, d]` (fp32 values) -> {topk: ids `[T, H, topk]`}: the prefill reference's rule for one
    request whose queries are its whole prompt (query i at position i), only the candidate blocks scored."""
    t, h, d = q.shape
    out = {kk: torch.empty((t, h, kk), dtype=torch.int32, device=q.device) for kk in topks}
    scale = 1.0 / math.sqrt(d)
    for own in range(-(-t // block)):
        a, b = own * block, min(t, (own + 1) * block)
        scores = (q[a:b].reshape(-1, d) @ k[:own * block].T).view(b - a, h, own, block).amax(-1) * scale
        local = torch.full((b - a,), own, dtype=torch.long, device=q.device)
        for kk in topks:
            out[kk][a:b] = select_blocks(scores, local, kk)
    return out


def compare(ref: torch.Tensor, ids: torch.Tensor, topk: int, block: int) -> Counts:
    """Counts of one layer: hits / size of the reference selection (every row); history hits / history slots,
    differing rows / rows, on the rows that must choose (own block >= topk)."""
    hit = ((ref[..., :, None] == ids[..., None, :]) & (ref[..., :, None] >= 0)).any(-1)  # [T, H, k]
    own = torch.arange(ref.shape[0], device=ref.device) // block
    contested = (own >= topk)[:, None].expand(ref.shape[:2])  # [T, H]: more candidates than history slots
    hist = hit[..., :topk - 1] & contested[..., None]  # a contested row's history fills slots 0..k-2
    differ = (~hit & (ref >= 0)).any(-1) & contested
    return {"hits": float(hit.sum()), "size": float((ref >= 0).sum()), "hist_hits": float(hist.sum()),
            "hist_size": float(contested.sum()) * (topk - 1), "differ": float(differ.sum()),
            "rows": float(contested.sum())}


def layer_counts(q: torch.Tensor, k: torch.Tensor, block: int = 128, topks: Sequence[int] = (16, 4),
                 variants: Sequence[str] = VARIANTS) -> LayerCounts:
    """One layer's captured q `[T, H, d]`, k `[T, d]` -> {variant: {topk: counts}} against bf16 q and k."""
    unknown = [v for v in variants if v not in VARIANT_INPUTS]
    if unknown:
        raise ValueError(f"unknown variants {unknown}: use any of {tuple(VARIANT_INPUTS)}")
    q, k = q.float(), k.float()
    qb, kb = q.to(torch.bfloat16).float(), k.to(torch.bfloat16).float()
    ref = block_selections(qb, kb, block, topks)
    out: LayerCounts = {}
    for v in variants:
        sel = block_selections(*VARIANT_INPUTS[v](q, k, qb, kb), block, topks)
        out[v] = {kk: compare(ref[kk], sel[kk], kk, block) for kk in topks}
    return out


def summarize(counts: Sequence[LayerCounts]) -> dict[str, dict[int, dict[str, float | None]]]:
    """Counts of layers (or of layers of several prompts) -> {variant: {topk: {agreement, history, rows_differ,
    rows}}}: `rows` = the contested (token, group) rows behind `history` and `rows_differ` (None when 0)."""
    if not counts:
        raise ValueError("summarize needs the counts of at least one layer")
    out: dict[str, dict[int, dict[str, float | None]]] = {}
    for v in counts[0]:
        out[v] = {}
        for kk in counts[0][v]:
            tot = {key: sum(c[v][kk][key] for c in counts) for key in counts[0][v][kk]}
            rows = tot["rows"]
            out[v][kk] = {"agreement": tot["hits"] / max(tot["size"], 1.0),
                          "history": tot["hist_hits"] / tot["hist_size"] if rows else None,
                          "rows_differ": tot["differ"] / rows if rows else None, "rows": rows}
    return out
