"""What the agent loop needs of a model: one chat turn with OpenAI-style tools.

These types live here, in the lowest package that uses them; the app's backends
(`msa_eval.backends`) satisfy `ChatModel` structurally, return these types, and
`msa_eval.backends.base` re-exports them, so there is one class of each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class BackendError(RuntimeError):
    """The harness, not the model, failed (unreachable endpoint, bad configuration)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text exactly as the model produced it


@dataclass
class ChatResponse:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    cost_usd: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class ChatModel(Protocol):
    name: str

    def describe(self) -> dict[str, Any]:
        """Config for the run manifest: model, attention, base URL... never secrets."""

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> ChatResponse:
        """One chat turn with OpenAI-style tools."""

    def count_tokens(self, text: str) -> int | None:
        """Tokens of `text` under this model's tokenizer, or None when unknown."""
