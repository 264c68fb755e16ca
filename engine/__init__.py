"""engine: token ids in, token ids out. Llama-family GQA models with dense or MSA attention,
paged KV cache, continuous batching with chunked prefill, and the offline `LLM` API.
`LLM`, `RequestOutput` and `SamplingParams` load on first use (they pull in torch), so the light
parts (`engine.errors`, `engine.attention.kinds`) import in milliseconds."""
import importlib.util
from pathlib import Path

from engine.errors import ContextTooLongError, EngineError, ModelNotFoundError, UnsupportedModelError

__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineError", "ContextTooLongError",
           "ModelNotFoundError", "UnsupportedModelError"]


def _check_own_kernels() -> None:
    """`kernels` is also the import name of Hugging Face's `kernels` distribution, a dependency of
    transformers >= 5.25; whichever comes first on the path hides the other. Refuse to run the
    engine on someone else's `kernels` rather than fail later on a missing submodule."""
    ours = Path(__file__).resolve().parents[1] / "kernels"
    spec = importlib.util.find_spec("kernels")
    origin = Path(spec.origin).resolve() if spec is not None and spec.origin else None
    if origin is None or origin.parent != ours:
        raise EngineError(f"`import kernels` finds {origin}, not msa-eval's {ours} (Hugging Face's `kernels`, "
                          "required by transformers >= 5.25, hides it): run `pip uninstall kernels` and "
                          "`pip install 'transformers<5.25'`")


_check_own_kernels()

_LAZY = {"LLM": "engine.llm", "RequestOutput": "engine.requests", "SamplingParams": "engine.sampling"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
