"""engine: token ids in, token ids out. Llama-family GQA models with dense or MSA attention,
paged KV cache, continuous batching with chunked prefill, and the offline `LLM` API.
`LLM`, `RequestOutput` and `SamplingParams` load on first use (they pull in torch), so the light
parts (`engine.errors`, `engine.attention.kinds`) import in milliseconds."""
from engine.errors import ContextTooLongError, EngineError, ModelNotFoundError, UnsupportedModelError

__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineError", "ContextTooLongError",
           "ModelNotFoundError", "UnsupportedModelError"]

_LAZY = {"LLM": "engine.llm", "RequestOutput": "engine.requests", "SamplingParams": "engine.sampling"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
