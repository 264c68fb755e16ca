"""engine: token ids in, token ids out. Llama-family GQA models with dense or MSA attention,
paged KV cache, continuous batching with chunked prefill, and the offline `LLM` API."""
from engine.errors import ContextTooLongError, EngineError, ModelNotFoundError, UnsupportedModelError
from engine.llm import LLM, RequestOutput
from engine.sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams", "EngineError", "ContextTooLongError",
           "ModelNotFoundError", "UnsupportedModelError"]
