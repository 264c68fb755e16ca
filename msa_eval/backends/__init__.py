"""Backends: how the runner and the agents reach a model (`local` in-process engine,
`openai` any OpenAI-compatible endpoint). All speak the interface in `base.py`."""
from msa_eval.backends.base import Backend, ChatResponse, GenRequest, GenResult, ToolCall

__all__ = ["Backend", "ChatResponse", "GenRequest", "GenResult", "ToolCall"]
