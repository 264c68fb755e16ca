"""Weight + tokenizer loading: `load(model)` resolves a name or path to (config, weights, tokenizer)."""
from engine.loader.resolve import LoadedModel, load, resolve_model_path

__all__ = ["LoadedModel", "load", "resolve_model_path"]
