"""Pydantic request/response models of the OpenAI-compatible HTTP API (the edge of the engine).

Only the fields the server honours are declared; unknown fields that clients commonly send
(`user`, `metadata`, ...) are ignored. Fields we cannot honour (n > 1, penalties, logit_bias,
suffix) are declared so that a non-default value is rejected with a 400 instead of silently
ignored (see `reject_unsupported`). Types are strict, as OpenAI's are: `"5"` is not an integer
and `"yes"` not a boolean (an integer is still accepted for a float). Every request body also
passes `jsonguard.check_json` (nesting depth, lone surrogates) before its fields are validated.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.server.jsonguard import RequestError, check_json

_NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
_INT64 = 2**63
MAX_TOP_LOGPROBS = 20  # alternatives per token (top_logprobs on chat, logprobs on completions), as OpenAI's cap


class _Lenient(BaseModel):
    """Request parts: unknown fields ignored, known ones strictly typed (no str -> int/bool coercion)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class RequestBody(_Lenient):
    """A whole request body: checked by `check_json` before any field is validated."""

    @model_validator(mode="before")
    @classmethod
    def _guard(cls, data: Any) -> Any:
        check_json(data)
        return data


# ---------------------------------------------------------------- errors
class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# ---------------------------------------------------------------- tools
class FunctionSpec(_Lenient):
    name: str = Field(pattern=_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON Schema of type 'object'")
        if v is not None and not isinstance(v.get("properties", {}), dict):
            raise ValueError("function parameters 'properties' must be an object")
        return v


class ToolSpec(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Lenient):
    name: str


class ToolChoiceFunction(_Lenient):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | ToolChoiceFunction


class ToolCallFunction(_Lenient):
    name: str
    arguments: str


class ToolCallModel(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


# ---------------------------------------------------------------- chat
class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallModel] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant turn's reasoning, handed to templates that show it

    def text(self) -> str:
        """The content as one string (text parts joined, None -> "")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class _SamplingFields(RequestBody):
    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)  # torch generators take any int64
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens (benchmarks)

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _openai_default(cls, v: Any) -> Any:
        """Left out or null: OpenAI's defaults, temperature 1 and top_p 1 (sampling; send 0 for greedy)."""
        return 1.0 if v is None else v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str]:
        stops = [] if v is None else [v] if isinstance(v, str) else list(v)
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("stop must be at most 16 non-empty strings")
        return stops

    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # type: ignore[arg-type]


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        """What OpenAI refuses with a 400 although each field is valid on its own."""
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        _check_tool_choice(self.tool_choice, self.tools)
        _check_tool_messages(self.messages)
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _check_tool_choice(choice: Any, tools: list[ToolSpec] | None) -> None:
    names = {t.function.name for t in tools or []}
    if isinstance(choice, ToolChoiceFunction) and choice.function.name not in names:
        where = f"which is not among tools {sorted(names)}" if names else "but no tools are given"
        raise RequestError(f"tool_choice names the function {choice.function.name!r}, {where}; add it to tools "
                           f"or name one of them", param="tool_choice")
    if choice == "required" and not names:
        raise RequestError("tool_choice 'required' needs tools; give tools or leave tool_choice out",
                           param="tool_choice")


def _check_tool_messages(messages: list[ChatMessage]) -> None:
    """A `tool` message answers a call of the assistant message before it (other tool results may sit between)."""
    open_ids: set[str] | None = None
    for i, m in enumerate(messages):
        if m.role == "assistant":
            open_ids = {c.id for c in m.tool_calls} if m.tool_calls else None
        elif m.role != "tool":
            open_ids = None
        elif open_ids is None:
            raise RequestError(f"messages[{i}] has role 'tool' but does not follow an assistant message with "
                               f"tool_calls; send the assistant message that made the call before its result",
                               param="messages")
        elif m.tool_call_id is not None and m.tool_call_id not in open_ids:
            raise RequestError(f"messages[{i}].tool_call_id {m.tool_call_id!r} matches no tool call of the assistant "
                               f"message before it (ids {sorted(open_ids)})", param="messages")


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None


# ---------------------------------------------------------------- responses
# msa_eval_timings: the server's timing split of the request (engine.server.timings), an extension field
Timings = dict[str, float] | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallModel] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """Chat's logprobs: one entry per generated token (engine.server.logprobs.chat_logprobs)."""

    content: list[TokenLogprob] | None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    msa_eval_timings: Timings = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None  # the rows of the tokens generated since the previous chunk


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    msa_eval_timings: Timings = None


class CompletionLogprobs(BaseModel):
    """Legacy completions logprobs: one entry per token (first prompt token has None)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    msa_eval_timings: Timings = None  # with several prompts: each choice's own


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    msa_eval_timings: Timings = None  # with one prompt


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "msa-eval"
    max_model_len: int
    kv_cache_dtype: str | None = None  # what the engine's K/V cache holds: fp8, bf16, fp16, fp32


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
