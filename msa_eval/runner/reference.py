"""The reference tokenizer: prompts are fitted with the tokenizer of the reference model
(the local model by default), read from the model files without loading the weights; or, with
`--tokenizer PATH`, an HF tokenizer directory (tokenizer.json, with tokenizer_config.json's chat
template when there is one) or a tokenizer.json file, e.g. an endpoint's model that is not here."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from msa_eval.runner.config import ConfigError

LENGTH_LADDER = (2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576)


def load_reference_tokenizer(model: str) -> tuple[Any, dict[str, Any]]:
    """(tokenizer, info) for a built-in model name, HF directory, .gguf path or a
    `tokenizer.json` file. info = {model_id, path, max_context, fingerprint}."""
    from engine.errors import EngineError

    p = Path(model).expanduser()
    if p.is_file() and p.name.endswith(".json"):
        return _from_tokenizer_json(p)
    if p.is_dir() and not (p / "config.json").is_file():
        return _from_tokenizer_dir(p)
    if not p.exists() and "+" not in model and ("/" in model or model.endswith(".json")):
        raise ConfigError(f"{p} does not exist: pass an HF tokenizer or model directory, a tokenizer.json "
                          "file, a .gguf file or a built-in model name")
    try:
        from engine.loader import load_tokenizer
        from engine.msa.setup import split_model_adapter

        base, _adapter = split_model_adapter(model)  # BASE+ADAPTER: the base's tokenizer
        loaded = load_tokenizer(base, progress=True)
    except EngineError as e:
        raise ConfigError(str(e)) from None
    tok = loaded.tokenizer
    return tok, {"model_id": loaded.model_id, "path": str(loaded.path), "max_context": loaded.config.max_position,
                 "fingerprint": tok.fingerprint()}


def _read_tokenizer_json(p: Path) -> Any:
    from tokenizers import Tokenizer as HFTokenizer

    try:
        return HFTokenizer.from_file(str(p))
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own error types on a bad file
        raise ConfigError(f"{p} does not load as a tokenizer ({str(e).splitlines()[0][:120]}): pass an HF "
                          "tokenizer directory or its tokenizer.json") from None


def _from_tokenizer_json(p: Path) -> tuple[Any, dict[str, Any]]:
    from engine.tokenizer import Tokenizer

    tok = Tokenizer(_read_tokenizer_json(p), None, None, None, set(), False)
    return tok, {"model_id": p.stem, "path": str(p), "max_context": None,
                 "fingerprint": tok.fingerprint()}


def _from_tokenizer_dir(p: Path) -> tuple[Any, dict[str, Any]]:
    """An HF tokenizer directory without the model's config.json: tokenizer.json, and from
    tokenizer_config.json (or chat_template.jinja) the chat template, BOS and EOS."""
    import json

    from engine.tokenizer import Tokenizer

    if not (p / "tokenizer.json").is_file():
        raise ConfigError(f"{p} has no tokenizer.json (nor config.json): pass an HF tokenizer or model "
                          "directory, a tokenizer.json file or a built-in model name")
    hf = _read_tokenizer_json(p / "tokenizer.json")
    cfg_path = p / "tokenizer_config.json"
    try:
        tcfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    except ValueError:
        raise ConfigError(f"{cfg_path} is not valid JSON: fix or remove it") from None
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
    if template is None and (p / "chat_template.jinja").is_file():
        template = (p / "chat_template.jinja").read_text()

    def token(v: Any) -> str | None:
        return v.get("content") if isinstance(v, dict) else v

    eos = token(tcfg.get("eos_token"))
    eos_ids = {hf.token_to_id(eos)} if eos and hf.token_to_id(eos) is not None else set()
    tok = Tokenizer(hf, template, token(tcfg.get("bos_token")), eos, eos_ids,
                    bool(tcfg.get("add_bos_token", False)))
    ctx = tcfg.get("model_max_length")
    return tok, {"model_id": p.name, "path": str(p),
                 "max_context": ctx if isinstance(ctx, int) and ctx < 1 << 30 else None,
                 "fingerprint": tok.fingerprint()}


def default_lengths(max_context: int | None, cap: int | None = None) -> tuple[int, ...]:
    """Ladder lengths the model can hold (and <= cap)."""
    limit = min(x for x in (max_context, cap) if x) if (max_context or cap) else 8192
    return tuple(x for x in LENGTH_LADDER if x <= limit) or (min(LENGTH_LADDER),)


def check_lengths(lengths: tuple[int, ...], max_context: int | None) -> None:
    if max_context is None:
        return
    too_long = [x for x in lengths if x > max_context]
    if too_long:
        raise ConfigError(
            f"length {too_long[0]} is beyond the model's context of {max_context} tokens: "
            f"use --lengths with values <= {max_context}")
