"""MSA adapters: the trained index projections of one base model, saved beside its `msa` config.

An adapter folder holds
  `indexer.safetensors`  the index projections (`layers.<i>.wq` `[Hkv*d_idx, hidden]`, `layers.<i>.wk`
                         `[d_idx, hidden]`, optional `q_norm`/`k_norm` `[d_idx]`), float16;
  `msa_config.json`      `{"format": 1, "msa": {...MSAConfig...}, "base": {...fingerprint...},
                         "tensors_sha256": ...}`;
  `provenance.json`      how it was made (written by `sparsify`; not needed to load).
The base fingerprint is a sha256 over the model's shape and its Q/K projection weights (float32, as
loaded), so an adapter is refused on any other base, whatever file format the base comes in.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.msa.config import MSAConfig, MSAConfigError
from engine.msa.projections import IndexProjections
from msa_common.atomic import atomic_write_bytes, atomic_write_json

TENSORS_FILE = "indexer.safetensors"
CONFIG_FILE = "msa_config.json"
PROVENANCE_FILE = "provenance.json"
FORMAT = 1


class AdapterError(EngineError):
    """An adapter that cannot be used (missing, corrupt, or made for another base model)."""


def base_fingerprint(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> str:
    """sha256 of the model shape and every layer's Q and K projection (float32 bytes)."""
    h = hashlib.sha256()
    shape = (cfg.arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    h.update(repr(shape).encode())
    for i in range(cfg.num_layers):
        for n in ("q_proj", "k_proj"):
            w = weights[f"model.layers.{i}.self_attn.{n}.weight"]
            h.update(w.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


@dataclass
class Adapter:
    msa: MSAConfig
    projections: IndexProjections
    base: dict[str, Any]
    path: Path | None = None


def write_json(path: Path, obj: Any) -> None:
    """An adapter's JSON file, written atomically: indent 2, keys sorted, non-JSON values refused."""
    atomic_write_json(path, obj, sort_keys=True, default=None)


def save_adapter(out: Path, proj: IndexProjections, base: dict[str, Any],
                 provenance: dict[str, Any] | None = None) -> None:
    from safetensors.torch import save as st_save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"layers.{k}": v.detach().to("cpu", torch.float16).contiguous()
               for k, v in proj.layers.state_dict().items()}
    blob = st_save(tensors, metadata={"format": str(FORMAT)})
    atomic_write_bytes(out / TENSORS_FILE, blob)
    write_json(out / CONFIG_FILE, {"format": FORMAT, "msa": proj.msa.to_dict(), "base": base,
                                   "tensors_sha256": hashlib.sha256(blob).hexdigest()})
    if provenance is not None:
        write_json(out / PROVENANCE_FILE, provenance)


def is_adapter_dir(p: str | Path) -> bool:
    p = Path(p).expanduser()
    return p.is_dir() and (p / CONFIG_FILE).is_file()


def load_adapter(path: str | Path, cfg: ModelConfig, fingerprint: str | None) -> Adapter:
    """Load and check an adapter for the base model `cfg` with the given fingerprint."""
    from safetensors.torch import load as st_load

    p = Path(path).expanduser()
    if not (p / CONFIG_FILE).is_file() or not (p / TENSORS_FILE).is_file():
        raise AdapterError(f"{p} is not an MSA adapter (needs {CONFIG_FILE} and {TENSORS_FILE}): "
                           "make one with `msa-eval sparsify --model BASE --out DIR`")
    try:
        meta = json.loads((p / CONFIG_FILE).read_text())
        msa = MSAConfig.from_dict(meta["msa"])
        base = dict(meta["base"])
    except (ValueError, KeyError, TypeError, MSAConfigError) as e:
        raise AdapterError(f"corrupt MSA adapter config {p / CONFIG_FILE} ({e}): re-run `msa-eval sparsify`") from None
    if fingerprint is not None and base.get("fingerprint") != fingerprint:
        raise AdapterError(f"adapter {p} was made for base model {base.get('model_id', '?')} "
                           f"(fingerprint {str(base.get('fingerprint'))[:12]}), not this model "
                           f"({fingerprint[:12]}): use the matching base or run `msa-eval sparsify` for this one")
    blob = (p / TENSORS_FILE).read_bytes()
    if meta.get("tensors_sha256") and hashlib.sha256(blob).hexdigest() != meta["tensors_sha256"]:
        raise AdapterError(f"corrupt MSA adapter: {p / TENSORS_FILE} does not match its recorded sha256: "
                           "re-run `msa-eval sparsify` or restore the file")
    try:
        tensors = st_load(blob)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise AdapterError(f"corrupt MSA adapter file {p / TENSORS_FILE} ({type(e).__name__}): "
                           "re-run `msa-eval sparsify`") from None
    msa.check_model(cfg)
    proj = IndexProjections(cfg, msa)
    want = {f"layers.{k}": v.shape for k, v in proj.layers.state_dict().items()}
    got = {k: v.shape for k, v in tensors.items()}
    if want != got:
        missing = sorted(set(want) - set(got))[:3]
        raise AdapterError(f"MSA adapter {p} does not fit this model (tensors {missing or 'shapes'} differ): "
                           "make one for this model with `msa-eval sparsify`")
    with torch.no_grad():
        proj.layers.load_state_dict({k[len("layers."):]: v.float() for k, v in tensors.items()})
    return Adapter(msa, proj, base, p)
