"""The MSA indexer of an `LLM`: find the adapter (one named with `--model BASE+ADAPTER`, or the one
shipped for a built-in model under `engine/adapters/<name>/`), check it against the base model and
the cache page size, and return an `engine.attention.Indexer` for `make_attention`.

`msa_overrides` (for tests and evaluations): `topk`, `block_size` (the page size follows),
`dense_layers` (may only ADD dense layers: the others need trained projections), `track_recall`
(read by the caller: it is an attention option, not part of the indexer).
"""
from __future__ import annotations

from pathlib import Path

import torch

from engine.attention.factory import Indexer
from engine.config import ModelConfig
from engine.errors import EngineError
from engine.msa.adapter import Adapter, AdapterError, base_fingerprint, is_adapter_dir, load_adapter
from engine.msa.config import MSAConfigError
from engine.msa.projections import IndexRope

ADAPTERS_DIR = Path(__file__).resolve().parent.parent / "adapters"
OVERRIDE_KEYS = frozenset({"topk", "block_size", "dense_layers", "track_recall"})


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


def load_indexer(model_id: str, adapter_path: str | Path | None, config: ModelConfig,
                 weights: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype,
                 page_size: int | None, msa_overrides: dict) -> tuple[Indexer, Adapter]:
    """(the indexer on `device` in `dtype`, the adapter it came from). `weights`: the base model's, to
    check the adapter was trained on it."""
    unknown = set(msa_overrides) - OVERRIDE_KEYS
    if unknown:
        raise EngineError(f"unknown msa_overrides {sorted(unknown)}: use {sorted(OVERRIDE_KEYS)}")
    adapter_path = adapter_path or shipped_adapter(model_id)
    if adapter_path is None:
        raise AdapterError(f"model {model_id} has no MSA indexer: run `msa-eval sparsify --model "
                           f"{model_id} --out DIR` and pass --model {model_id}+DIR (or use --attention dense)")
    adapter = load_adapter(adapter_path, config, base_fingerprint(config, weights))
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
    msa.check_model(config)
    proj = adapter.projections
    for i in msa.dense_layers:
        if str(i) in proj.layers:
            del proj.layers[str(i)]
    proj.msa = msa
    proj.to(device=device, dtype=dtype)
    return Indexer(msa, proj, IndexRope(config, msa.d_idx, device)), adapter
