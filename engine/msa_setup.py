"""Build the MSA attention of an `LLM`: find the indexer (an adapter named with `--model BASE+ADAPTER`,
or the one shipped for a built-in model under `engine/adapters/<name>/`), check it against the base
model and the cache page size, and return `(attention, index_layers, index_dim, page_size)`.

`msa_overrides` (for tests and evaluations): `topk`, `block_size` (the page size follows),
`dense_layers` (may only ADD dense layers: the others need trained projections), `track_recall`.

Which attention class: `--attention msa` on a CUDA device gets `GraphMSAAttention`
(engine/gpu/msa_graph.py: decode steps through preplanned kernels, replayed from CUDA graphs when
the engine's `cuda_graphs` is on, the same plans launched eagerly when it is off); on the CPU, and
for `msa-ref` everywhere, the plain `MSAAttention` (no decode plans: reference or masked-SDPA path).
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.errors import EngineError
from engine.msa.adapter import AdapterError, base_fingerprint, is_adapter_dir, load_adapter
from engine.msa.config import MSAConfigError
from engine.msa.projections import IndexRope

ADAPTERS_DIR = Path(__file__).parent / "adapters"
_OVERRIDE_KEYS = {"topk", "block_size", "dense_layers", "track_recall"}


def split_model_adapter(model: str) -> tuple[str, str | None]:
    """`BASE+ADAPTER_DIR` -> (BASE, ADAPTER_DIR); a plain model -> (model, None).

    Split at the last '+' whose right side is an existing adapter folder (paths may contain '+')."""
    if "+" not in model:
        return model, None
    base, _, adapter = model.rpartition("+")
    if base and is_adapter_dir(adapter):
        return base, adapter
    if base and Path(adapter).expanduser().exists():
        raise AdapterError(f"{adapter} is not an MSA adapter folder (no msa_config.json): "
                           "make one with `msa-eval sparsify --model BASE --out DIR`")
    return model, None


def shipped_adapter(model_id: str) -> Path | None:
    p = ADAPTERS_DIR / model_id
    return p if is_adapter_dir(p) else None


def msa_attention_class(impl: str, device: torch.device) -> type:
    """`GraphMSAAttention` for the kernel path ("auto") on a CUDA device, else `MSAAttention`."""
    from engine.attention.msa import MSAAttention

    if impl == "auto" and torch.device(device).type == "cuda":
        from engine.gpu.msa_graph import GraphMSAAttention

        return GraphMSAAttention
    return MSAAttention


def make_msa_attention(llm, attention: str, loaded, page_size: int | None, msa_overrides: dict):
    unknown = set(msa_overrides) - _OVERRIDE_KEYS
    if unknown:
        raise EngineError(f"unknown msa_overrides {sorted(unknown)}: use {sorted(_OVERRIDE_KEYS)}")
    adapter_path = getattr(llm, "msa_adapter_path", None) or shipped_adapter(llm.model_id)
    if adapter_path is None:
        raise AdapterError(f"model {llm.model_id} has no MSA indexer: run `msa-eval sparsify --model "
                           f"{llm.model_id} --out DIR` and pass --model {llm.model_id}+DIR (or use --attention dense)")
    adapter = load_adapter(adapter_path, llm.config, base_fingerprint(llm.config, loaded.weights))
    msa = adapter.msa
    extra_dense = msa_overrides.get("dense_layers")
    if extra_dense is not None:
        extra_dense = tuple(extra_dense)
        if not set(msa.dense_layers) <= set(extra_dense):
            raise MSAConfigError(f"dense layers {extra_dense} drop the adapter's dense layers {msa.dense_layers}: "
                                 "those have no trained index projections")
    msa = msa.replace(topk=msa_overrides.get("topk"), block_size=msa_overrides.get("block_size"),
                      dense_layers=extra_dense)
    if page_size is not None and page_size != msa.block_size:
        raise MSAConfigError(f"MSA block size {msa.block_size} must equal the KV cache page size {page_size}: "
                             f"pass page_size={msa.block_size} (or leave it unset)")
    msa.check_model(llm.config)
    proj = adapter.projections
    for i in msa.dense_layers:
        if str(i) in proj.layers:
            del proj.layers[str(i)]
    proj.msa = msa
    proj.to(device=llm.device, dtype=llm.dtype)
    llm.msa = msa
    llm.msa_adapter = adapter
    rope = IndexRope(llm.config, msa.d_idx, llm.device)
    impl = "torch" if attention == "msa-ref" else "auto"
    attn_cls = msa_attention_class(impl, llm.device)
    attn = attn_cls(msa, proj, rope, llm.config.num_layers, llm.config.head_dim ** -0.5, impl=impl,
                    track_recall=bool(msa_overrides.get("track_recall", False)))
    return attn, proj.layer_ids, msa.d_idx, msa.block_size
