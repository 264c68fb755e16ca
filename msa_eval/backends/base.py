"""The one interface between the app (runner, agents) and a model. Its chat half (`ChatModel`,
`ToolCall`, `ChatResponse`, `BackendError`) is defined in `agents.protocol`, the lowest
package that needs it, and re-exported here.

A backend takes prompts as *text* (or chat messages) so that the identical prompt text goes
to every backend; token counting is the backend's business and is reported back.
Errors of the model (empty output, bad format) are data; errors of the harness (endpoint
unreachable after retries, invalid config) raise `BackendError`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agents.protocol import BackendError, ChatModel, ChatResponse, ToolCall

__all__ = ["Backend", "BackendError", "ChatModel", "ChatResponse", "GenRequest", "GenResult", "ToolCall"]


@dataclass
class GenRequest:
    """One generation. Exactly one of `prompt` (completion mode) or `messages` (chat mode)."""

    id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class GenResult:
    id: str
    text: str
    finish_reason: str = "stop"  # "stop" | "length" | "error"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    queue_s: float | None = None  # waiting before the first scheduled step (a server that reports it, the local engine)
    prefill_s: float | None = None
    decode_s: float | None = None
    error: str | None = None
    # backend-specific measurements: attention_density, cost_usd, cached, peak_mem_bytes ...
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Backend(ChatModel, Protocol):
    """A chat model (what the agents need, `agents.protocol.ChatModel`) that also generates
    single prompts in batches (what the runner needs)."""

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Run a batch; the backend applies its own concurrency. Same order as `requests`.

        A backend may also offer `generate_stream(requests, window=N) -> Iterator[GenResult]` (results in
        finishing order, at most N requests in flight): the runner prefers it (the local engine has it)."""
