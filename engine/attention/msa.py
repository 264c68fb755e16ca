"""MSA attention for the engine: per MSA layer, write the index keys into the paged index-K
cache, select the top-k blocks (prefill indexer for chunks, decode indexer for decode steps),
then exact attention over the selected blocks; the configured dense layers run the dense
attention given (`engine.attention.make_attention` builds both for the device).

`MSAAttention` calls the kernels with the implementation it was built with: `impl="torch"`
(`--attention msa-ref`: the kernels' torch references, any device) or `impl="triton"` (CUDA; the
base of `engine.gpu.msa_graph.GraphMSAAttention`, what `--attention msa` gets on a GPU).
`CpuMaskedMSA` (`--attention msa` on a CPU): `cpu_indexer` selects (decode: the reference) and
`msa_cpu` attends over the selected blocks only (exact, work proportional to the selection).

Statistics per request (summed over layers) in `meta.stats`: `keys_read` (keys the layer's
attention reads: `(n_valid - 1) * B + pos % B + 1` per query with `n_valid = min(k, pos // B + 1)`,
whatever blocks are picked) and `keys_dense` (`pos + 1`). With `track_recall=True` (the reference
kind, msa-ref) each MSA layer also adds the dense softmax mass that falls inside its selected blocks
to `recall[layer] = [mass_sum, n_query_heads]`. When the engine gives `meta.telemetry` (selection
telemetry, `engine.msa.telemetry`), each MSA layer hands its selected ids to `observe_layer`.

An FP8 cache: the layer's scales (`k_scale`, `v_scale`) go to the kernel ops (the contract of issue 22: their
references dequantise exactly, their kernels run FP8 dots); the CPU block-sparse attention dequantises the
blocks it gathers; the readers of whole pages (oracle selection, recall, telemetry) get the pages in use
dequantised (`engine.kv_fp8.dequant_pages`). Its index keys are int8 with per-token scales (`KVCache.write_index_keys`);
both indexers score them with the queries rounded to int8 per row (`kernels._common.int8`).
"""
from __future__ import annotations

from typing import Literal

import torch

from engine.attention.dense import DenseAttention
from engine.attention.meta import AttentionMeta
from engine.kv_fp8 import dequant_pages
from engine.msa.config import MSAConfig
from engine.msa.projections import IndexProjections, IndexRope
from engine.msa.recall import selected_mass
from engine.msa.telemetry import observe_layer

# Sparse prefill kernel design, fixed so that a layer needs no host sync. design="auto" (one sync per
# layer) picks the per-token kernel only when a tile's union of selected blocks passes the measured
# break-even (kernels/sparse_prefill/config.py: 12 k blocks per 16-token tile for G < 8, i.e. 192 of
# at most 241 at k = 16; with the rare-block split for G >= 8 it picked the tile on every selection
# measured); so "tile" gives what "auto" gave.
PREFILL_DESIGN = "tile"


def scale_kw(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The kernel ops' FP8 keyword arguments: none for a bf16/fp16/fp32 cache (so ops without them still work)."""
    return {} if k_scale is None or v_scale is None else {"k_scale": k_scale, "v_scale": v_scale}


class MSAAttention:
    supports_cuda_graphs = False  # its per-layer kernel calls plan and sync on their own
    selects_by_keys = False  # the selection reads the main keys (the oracle): it needs them as values

    def __init__(self, msa: MSAConfig, projections: IndexProjections, rope: IndexRope, num_layers: int,
                 scale: float, dense: DenseAttention, impl: Literal["torch", "triton"] = "torch",
                 track_recall: bool = False):
        self.msa, self.proj, self.rope, self.scale, self.impl = msa, projections, rope, scale, impl
        self.num_layers = num_layers
        self.msa_layers = set(projections.layer_ids)
        self.last_msa_layer = max(self.msa_layers, default=-1)  # telemetry hands a forward's rows over after it
        self.dense = dense
        self.track_recall = track_recall
        self.recall: dict[int, list[float]] = {}

    # -- statistics -----------------------------------------------------------------------
    def _fill_stats(self, meta: AttentionMeta) -> None:
        B, k = self.msa.block_size, self.msa.topk
        n_msa = len(self.msa_layers)
        n_dense = self.num_layers - n_msa
        read, dense = [], []
        for ql, kl in zip(meta.q_lens, meta.kv_lens, strict=True):
            r = d = 0
            for pos in range(kl - ql, kl):
                r += (min(k, pos // B + 1) - 1) * B + pos % B + 1
                d += pos + 1
            read.append(float(n_msa * r + n_dense * d))
            dense.append(float(self.num_layers * d))
        meta.stats["keys_read"], meta.stats["keys_dense"] = read, dense

    def reset_recall(self) -> None:
        self.recall = {}

    def recall_by_layer(self) -> dict[int, float]:
        return {i: s / max(n, 1) for i, (s, n) in sorted(self.recall.items())}

    # -- the layer call -------------------------------------------------------------------
    def __call__(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMeta, *, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 cache, positions: torch.Tensor, k_scale: torch.Tensor | None = None,
                 v_scale: torch.Tensor | None = None, **_: object) -> torch.Tensor:
        if layer == 0:
            self._fill_stats(meta)
        if layer not in self.msa_layers:
            return self.dense(layer, q, k_cache, v_cache, meta, k_scale=k_scale, v_scale=v_scale)
        q_idx, k_idx = self.proj[layer](hidden, self.rope, cos, sin, positions)
        cache.write_index_keys(layer, meta.slot_pages, meta.slot_offsets, k_idx)
        scales = scale_kw(k_scale, v_scale)
        measured = meta.telemetry is not None or self.track_recall or self.selects_by_keys
        keys = dequant_pages(k_cache, k_scale, meta, q.dtype) if measured else k_cache  # values for the readers
        ids = self._select(q, q_idx.to(cache.cfg.index_query_dtype), keys, cache.k_idx[layer], meta,
                           cache.index_scale(layer))
        out = self._attend(q, k_cache, v_cache, ids, meta, **scales)
        if meta.telemetry is not None:  # engine.msa.telemetry: probe rows against the oracle
            observe_layer(layer, q, keys, ids, meta, self.msa.topk, self.scale, last=layer == self.last_msa_layer)
        if self.track_recall:
            s, n = selected_mass(q, keys, meta, ids, self.scale)
            acc = self.recall.setdefault(layer, [0.0, 0])
            acc[0] += s
            acc[1] += n
        return out

    def _select(self, q, q_idx, k_cache, kic, meta: AttentionMeta, kis: torch.Tensor | None) -> torch.Tensor:
        """The indexer's block ids `[T, Hkv, k]` (decode indexer for decode steps, prefill indexer for chunks);
        `k_cache` holds values (dequantised when the cache is FP8 and `selects_by_keys`); `kis`: the scales of
        int8 index keys `kic`, or None."""
        if meta.is_decode:
            from kernels.decode import msa_decode_indexer

            return msa_decode_indexer(q_idx, kic, meta.page_table, meta.seq_lens_kv, 1, self.msa.topk,
                                      k_idx_scale=kis, impl=self.impl)
        from kernels.indexer import msa_indexer

        # no host sync per layer: the lengths come from the engine's own metadata (shapes are still checked)
        return msa_indexer(q_idx, kic, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, self.msa.topk,
                           impl=self.impl, check_lengths=False, k_idx_scale=kis)

    def _attend(self, q, k_cache, v_cache, ids, meta: AttentionMeta, **scales: torch.Tensor) -> torch.Tensor:
        """Exact attention over the selected blocks (the kernel design is fixed: PREFILL_DESIGN); `scales`:
        `k_scale`, `v_scale` of an FP8 cache, or none."""
        if meta.is_decode:
            from kernels.decode import msa_decode_attention

            return msa_decode_attention(q, k_cache, v_cache, ids, meta.page_table, meta.seq_lens_kv, 1,
                                        softmax_scale=self.scale, impl=self.impl, **scales)
        from kernels.sparse_prefill import msa_prefill_attention

        out, _ = msa_prefill_attention(q, k_cache, v_cache, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv,
                                       ids, scale=self.scale, impl=self.impl, design=PREFILL_DESIGN,
                                       check_ids=False, check_lengths=False, **scales)
        return out


class CpuMaskedMSA(MSAAttention):
    """`--attention msa` on the CPU: prefill chunks select through `cpu_indexer` (the reference's rule, only
    the candidate blocks scored), decode steps through the decode reference; `msa_cpu` attends over the
    selected blocks only."""

    def _select(self, q, q_idx, k_cache, kic, meta: AttentionMeta, kis: torch.Tensor | None) -> torch.Tensor:
        if meta.is_decode:
            return super()._select(q, q_idx, k_cache, kic, meta, kis)
        from engine.attention.cpu_indexer import prefill_block_ids

        return prefill_block_ids(q_idx, kic, meta, self.msa.topk, kis)

    def _attend(self, q, k_cache, v_cache, ids, meta: AttentionMeta, **scales: torch.Tensor) -> torch.Tensor:
        from engine.attention.msa_cpu import sparse_attention

        return sparse_attention(q, k_cache, v_cache, meta, ids, self.scale, **scales)  # block = page
