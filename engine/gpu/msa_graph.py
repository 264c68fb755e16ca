"""MSA attention with capturable decode: the engine's `MSAAttention` (engine/attention/msa.py, its
prefill path unchanged) plus the decode-plan hook, so decode steps replay from CUDA graphs.
`--attention msa` gets it on a CUDA device (`engine.attention.make_attention`, impl "triton"); with
the engine's `cuda_graphs` off the same plans launch eagerly, one plan per step instead of per layer.

Per decode step `plan_decode` fills one `kernels.decode.MSADecodePlan` (indexer + sparse
attention over the top-k pages) and one `DenseDecodePlan` (the configured dense layers); each
layer call then only projects the index q/k, writes the index key into the paged index-K cache
and launches the plan's kernels: no host sync, no allocation, so the call is capturable.
The per-request statistics (`keys_read`, `keys_dense`) are computed in closed form once per
step from the lengths (not per position in Python), outside the graph.
An FP8 cache: the plans are built with `kv_dtype=torch.float8_e4m3fn` (their FP8 kernels) and each layer
call passes the layer's scales (`k_scale`, `v_scale`: fixed tensors of the cache, so capture is unchanged).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.meta import AttentionMeta, DecodeShapes
from engine.attention.msa import MSAAttention, scale_kw
from engine.kv_fp8 import dequant_pages
from engine.msa.telemetry import observe_layer


@dataclass
class MSADecodePlans:
    msa: object  # kernels.decode.MSADecodePlan
    dense: object | None  # kernels.decode.DenseDecodePlan, when some layers stay dense

    def plans(self) -> list:
        """The kernel plans (the graph runner rebinds their length / page-table buffers)."""
        return [self.msa] + ([self.dense] if self.dense is not None else [])


def keys_read_closed_form(q_lens: list[int], kv_lens: list[int], block: int, topk: int) -> tuple[list[int], list[int]]:
    """Per request, summed over its query positions p in [kv - q, kv): keys one MSA layer reads,
    `(min(k, p // B + 1) - 1) * B + p % B + 1`, and keys dense attention reads, `p + 1`."""
    read, dense = [], []
    for ql, kl in zip(q_lens, kv_lens, strict=True):
        if ql <= 64:  # decode: a few Python ints per request (this runs every step)
            read.append(sum((min(topk, p // block + 1) - 1) * block + p % block + 1 for p in range(kl - ql, kl)))
        else:
            p = torch.arange(kl - ql, kl, dtype=torch.int64)
            read.append(int(((torch.clamp(p // block + 1, max=topk) - 1) * block + p % block + 1).sum()))
        dense.append((kl - ql + 1 + kl) * ql // 2)
    return read, dense


class GraphMSAAttention(MSAAttention):
    supports_cuda_graphs = True

    def __init__(self, *args, impl="triton", **kwargs):
        super().__init__(*args, impl=impl, **kwargs)
        self._plans: dict = {}

    def decode_stats(self, meta: AttentionMeta) -> None:
        """Per-request `keys_read` / `keys_dense` of a decode step from `meta.q_lens` / `meta.kv_lens`
        (also called alone by the graph runner on steps that need no `plan_decode`)."""
        n_msa = len(self.msa_layers)
        n_dense = self.num_layers - n_msa
        r, d = keys_read_closed_form(meta.q_lens, meta.kv_lens, self.msa.block_size, self.msa.topk)
        meta.stats["keys_read"] = [float(n_msa * a + n_dense * b) for a, b in zip(r, d, strict=True)]
        meta.stats["keys_dense"] = [float(self.num_layers * b) for b in d]

    def plan_decode(self, meta: AttentionMeta, shapes: DecodeShapes, key="eager") -> None:
        from kernels.decode import DenseDecodePlan, MSADecodePlan

        plans = self._plans.get(key)
        if plans is None:
            common = dict(device=shapes.device, dtype=shapes.dtype, softmax_scale=self.scale, impl=self.impl)
            if shapes.kv_dtype is not None:  # the plans' FP8 kernels
                common["kv_dtype"] = shapes.kv_dtype
            dims = (shapes.num_heads, shapes.num_kv_heads, shapes.head_dim, shapes.page_size)
            plans = self._plans[key] = MSADecodePlans(
                MSADecodePlan(*dims, topk=self.msa.topk, index_dim=self.msa.d_idx, index_dtype=shapes.index_dtype,
                              **common),
                DenseDecodePlan(*dims, **common) if len(self.msa_layers) < self.num_layers else None)
        plans.msa.plan(meta.seq_lens_host, meta.page_table_host, 1)
        if plans.dense is not None:
            plans.dense.plan(meta.seq_lens_host, meta.page_table_host, 1)
        meta.decode_plan = plans
        self.decode_stats(meta)

    def __call__(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMeta, *, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 cache, positions: torch.Tensor, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None, **kw: object) -> torch.Tensor:
        plans = meta.decode_plan
        if not isinstance(plans, MSADecodePlans):  # prefill chunks, mixed steps: MSAAttention's path
            return super().__call__(layer, q, k_cache, v_cache, meta, hidden=hidden, cos=cos, sin=sin,
                                    cache=cache, positions=positions, k_scale=k_scale, v_scale=v_scale, **kw)
        scales = scale_kw(k_scale, v_scale)
        if layer not in self.msa_layers:
            return plans.dense.run(q, k_cache, v_cache, **scales)
        q_idx, k_idx = self.proj[layer](hidden, self.rope, cos, sin, positions)
        cache.write_index_keys(layer, meta.slot_pages, meta.slot_offsets, k_idx)
        out = plans.msa.run(q, q_idx.to(cache.cfg.index_query_dtype), k_cache, v_cache, cache.k_idx[layer],
                            cache.index_scale(layer), **scales)
        if meta.telemetry is not None:  # an eager step (the engine turns graphs off for telemetry)
            keys = dequant_pages(k_cache, k_scale, meta, q.dtype)
            observe_layer(layer, q, keys, plans.msa.topk_ids, meta, self.msa.topk, self.scale,
                          last=layer == self.last_msa_layer)
        return out
