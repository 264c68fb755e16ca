"""`make_attention(kind, device, model_config, indexer)`: the one place that turns an attention kind
and a device into the object every layer calls. Nothing downstream looks at the device again; each
object passes its own kernel implementation to the kernels.

| kind | CUDA | CPU |
| --- | --- | --- |
| `dense` | `GpuDenseAttention`: paged split-K decode kernel, SDPA prefill | `DenseAttention`: SDPA, batched decode |
| `msa` | `GraphMSAAttention`: Triton kernels, decode plans | `CpuMaskedMSA`: `cpu_indexer`, `msa_cpu` (block-sparse) |
| `msa-ref` | `MSAAttention(impl="torch")`: the kernels' references | the same |
| `msa-oracle` | `GpuOracleMSA`: oracle selection, Triton attention | `OracleMSA`: oracle selection, `msa_cpu` |

The CUDA objects of `dense` and `msa` are capturable (`supports_cuda_graphs`): the engine replays
their decode steps from CUDA graphs.

The dense layers of an MSA model run the device's dense attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.dense import DenseAttention, GpuDenseAttention
from engine.attention.kinds import AttentionKind, check_kind, uses_indexer
from engine.attention.meta import Attention
from engine.config import ModelConfig
from engine.msa.config import MSAConfig
from engine.msa.projections import IndexProjections, IndexRope


@dataclass(frozen=True)
class Indexer:
    """What an MSA kind needs besides the model: the MSA config, the per-layer index projections
    (on the model's device and dtype) and the index RoPE."""

    config: MSAConfig
    projections: IndexProjections
    rope: IndexRope

    @property
    def layers(self) -> tuple[int, ...]:
        """The MSA layers (those with index projections; the index-K cache holds these)."""
        return tuple(self.projections.layer_ids)


def make_attention(kind: AttentionKind, device: torch.device | str, model_config: ModelConfig,
                   indexer: Indexer | None = None, *, track_recall: bool = False) -> Attention:
    """The attention object of `kind` on `device` (table in the module docstring). MSA kinds need the
    `indexer`; `track_recall` (per-layer attention-mass recall) is measured on the reference kind only."""
    kind = check_kind(kind)
    scale = model_config.head_dim ** -0.5
    cuda = torch.device(device).type == "cuda"
    dense = GpuDenseAttention(scale) if cuda else DenseAttention(scale)
    if not uses_indexer(kind):
        return dense
    if indexer is None:
        raise ValueError(f"attention '{kind}' needs an MSA indexer (engine.msa.setup.load_indexer)")
    if track_recall and kind != "msa-ref":
        raise ValueError("attention-mass recall is measured on the reference path: use attention='msa-ref'")
    parts = (indexer.config, indexer.projections, indexer.rope, model_config.num_layers, scale, dense)
    if kind == "msa-ref":
        from engine.attention.msa import MSAAttention

        return MSAAttention(*parts, impl="torch", track_recall=track_recall)
    if kind == "msa-oracle":
        from engine.attention.oracle import GpuOracleMSA, OracleMSA

        return GpuOracleMSA(*parts, impl="triton") if cuda else OracleMSA(*parts)
    if cuda:
        from engine.gpu.msa_graph import GraphMSAAttention

        return GraphMSAAttention(*parts)
    from engine.attention.msa import CpuMaskedMSA

    return CpuMaskedMSA(*parts)
