"""Resolve `--model` (built-in name, HF directory, .gguf path) and load it: `load` (config, weights,
tokenizer) or `load_tokenizer` (config and tokenizer only, no weights read)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import store
from engine.config import ModelConfig
from engine.errors import ModelNotFoundError
from engine.tokenizer import Tokenizer


@dataclass
class LoadedModel:
    model_id: str  # a short name for reports
    path: Path
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF parameter names, float32
    tokenizer: Tokenizer
    sha256: str | None  # of the weights file (GGUF) or None when not computed


def resolve_model_path(model: str, progress: bool = True) -> tuple[str, Path]:
    """Return (model_id, path). Built-in names are pulled on first use."""
    if model in store.BUILTIN_MODELS:
        return model, store.ensure(model, progress=progress)
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p.stem, p
    if p.is_dir() and (p / "config.json").is_file():
        return p.name, p
    if p.exists():
        raise ModelNotFoundError(
            f"{model} is neither a .gguf file nor a directory with config.json: pass a built-in name "
            f"({', '.join(store.BUILTIN_MODELS)}), an HF model directory or a .gguf path")
    return store._builtin(model).name, Path()  # raises the unknown-name error


def model_family(model: str) -> str:
    """"minimax_m3" for a MiniMax-M3 checkpoint directory, else "llama" (built-in names, .gguf files and
    Llama-family directories; unreadable paths are left to `load` to report)."""
    import json

    from engine.config import from_hf_config

    p = Path(model).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return from_hf_config(json.loads((p / "config.json").read_text())).family
    return "llama"


@dataclass
class LoadedTokenizer:
    model_id: str
    path: Path
    config: ModelConfig
    tokenizer: Tokenizer


def _dequant_cache(path: Path, sha: str | None) -> Path:
    """Where the dequantized float32 weights of a GGUF are cached (dequantizing takes seconds)."""
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    key = sha[:16] if sha else hashlib.sha256(stamp.encode()).hexdigest()[:16]
    return store.home() / "dequant" / key


def load(model: str, progress: bool = True, dequant_cache: bool = True) -> LoadedModel:
    """`dequant_cache`: keep a GGUF's dequantized weights under the msa-eval home for the next load."""
    model_id, path = resolve_model_path(model, progress=progress)
    if path.suffix == ".gguf":
        from engine.loader.gguf_loader import load_gguf

        sha = store.BUILTIN_MODELS[model].sha256 if model in store.BUILTIN_MODELS else None
        cfg, weights, tok = load_gguf(path, cache_dir=_dequant_cache(path, sha) if dequant_cache else None)
    else:
        from engine.loader.hf_loader import load_hf_dir

        cfg, weights, tok = load_hf_dir(path)
        sha = None
    return LoadedModel(model_id, path, cfg, weights, tok, sha)


def load_tokenizer(model: str, progress: bool = True) -> LoadedTokenizer:
    """The model's config and tokenizer, read from its files without loading the weights."""
    model_id, path = resolve_model_path(model, progress=progress)
    if path.suffix == ".gguf":
        from engine.loader.gguf_loader import _reader, gguf_config, gguf_tokenizer

        reader = _reader(path)
        cfg = gguf_config(reader)
        return LoadedTokenizer(model_id, path, cfg, gguf_tokenizer(reader, cfg))
    import json

    from engine.config import from_hf_config
    from engine.loader.hf_loader import load_hf_tokenizer

    cfg = from_hf_config(json.loads((path / "config.json").read_text()))
    return LoadedTokenizer(model_id, path, cfg, load_hf_tokenizer(path, cfg))
