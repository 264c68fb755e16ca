"""Load an HF model directory: config.json, *.safetensors (sharded or not), tokenizer.json,
tokenizer_config.json (chat template, special tokens), generation_config.json (eos ids)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import ModelConfig, from_hf_config
from engine.errors import ModelIntegrityError, ModelNotFoundError
from engine.tokenizer import Tokenizer


def _token_str(x) -> str | None:
    if isinstance(x, dict):
        return x.get("content")
    return x


def load_hf_tokenizer(path: Path, cfg: ModelConfig) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    tj = path / "tokenizer.json"
    if not tj.is_file():
        raise ModelNotFoundError(f"{path} has no tokenizer.json: save the fast tokenizer next to the weights")
    tok = HFTokenizer.from_file(str(tj))
    tcfg_path = path / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text()) if tcfg_path.is_file() else {}
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    eos_ids = set(cfg.eos_token_ids)
    gen = path / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        eos_ids |= set(e) if isinstance(e, list) else ({e} if e is not None else set())
    eos_tok = _token_str(tcfg.get("eos_token"))
    if eos_tok and tok.token_to_id(eos_tok) is not None:
        eos_ids.add(tok.token_to_id(eos_tok))
    return Tokenizer(tok, template, _token_str(tcfg.get("bos_token")), eos_tok, eos_ids,
                     add_bos=bool(tcfg.get("add_bos_token", False)))


def load_hf_dir(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    from safetensors.torch import load_file

    cfg = from_hf_config(json.loads((path / "config.json").read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{path} has no *.safetensors files: save the model with safe_serialization=True")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            for k, v in load_file(str(f)).items():
                weights[k] = v.float()
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types on a damaged file
            raise ModelIntegrityError(f"{f} cannot be read ({str(e)[:120]}): it is truncated or corrupt") from None
    return cfg, weights, load_hf_tokenizer(path, cfg)
