"""Weight + tokenizer loading: `load(model)` resolves a name or path to (config, weights, tokenizer);
`load_tokenizer(model)` reads the config and tokenizer only."""
from engine.loader.resolve import (
    LoadedModel,
    LoadedTokenizer,
    load,
    load_tokenizer,
    model_family,
    resolve_model_path,
)

__all__ = ["LoadedModel", "LoadedTokenizer", "load", "load_tokenizer", "model_family", "resolve_model_path"]
