"""The reference tokenizer: prompts are fitted with the tokenizer of the reference model
(the local model by default), read from the model files without loading the weights."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from msa_eval.runner.config import ConfigError

LENGTH_LADDER = (2048, 4096, 8192, 16384, 32768, 65536, 131072)


def load_reference_tokenizer(model: str) -> tuple[Any, dict[str, Any]]:
    """(tokenizer, info) for a built-in model name, HF directory, .gguf path or a
    `tokenizer.json` file. info = {model_id, path, max_context, fingerprint}."""
    from engine.errors import EngineError

    p = Path(model).expanduser()
    if p.is_file() and p.name.endswith(".json"):
        return _from_tokenizer_json(p)
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


def _from_tokenizer_json(p: Path) -> tuple[Any, dict[str, Any]]:
    from tokenizers import Tokenizer as HFTokenizer

    from engine.tokenizer import Tokenizer

    tok = Tokenizer(HFTokenizer.from_file(str(p)), None, None, None, set(), False)
    return tok, {"model_id": p.stem, "path": str(p), "max_context": None,
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
