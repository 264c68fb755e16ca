"""Pydantic models of POST /v1/responses (OpenAI's Responses API): the request subset we serve, the output.

The request is checked harder than chat's: a top-level field that is not declared here is a 400 naming it
(OpenAI's API does the same), and a declared field the server cannot honour is a 400 when it asks for
more than the default (see `engine.server.responses.chat_request`). Items inside `input` are typed by
their `type` (a message may leave it out) and keep ignoring the fields that only matter to OpenAI's
storage (`id`, `status`, `annotations`, `phase`, ...). The output models carry exactly what the
official SDK reads.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator, model_validator

from engine.server.jsonguard import RequestError
from engine.server.schemas import MAX_TOP_LOGPROBS, FunctionSpec, RequestBody, Timings, _Lenient

INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
# `include` values: the first is honoured; the others name outputs this server never produces (ignored)
INCLUDE_LOGPROBS = "message.output_text.logprobs"
INCLUDE_IGNORED = ("reasoning.encrypted_content", "file_search_call.results", "web_search_call.results",
                   "web_search_call.action.sources", "code_interpreter_call.outputs",
                   "computer_call_output.output.image_url", "message.input_image.image_url")


# ---------------------------------------------------------------- input items
class ContentPart(_Lenient):
    """A part of a message's content; only text parts are read (`engine.server.responses` refuses others)."""

    type: str
    text: str | None = None
    refusal: str | None = None


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]


class ReasoningItem(_Lenient):
    """A reasoning item handed back: its plain text (content, else summary) goes to the next assistant
    turn's `reasoning_content`; `encrypted_content` cannot be read here and is dropped."""

    type: Literal["reasoning"]
    summary: list[ContentPart] = []
    content: list[ContentPart] | None = None


def _item_type(v: Any) -> str:
    return (v.get("type") or "message") if isinstance(v, dict) else getattr(v, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")] | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


# ---------------------------------------------------------------- tools, text, reasoning
class FunctionTool(FunctionSpec):
    """A function tool in the Responses API's flat form (`{"type": "function", "name", "parameters", ...}`)."""

    type: Literal["function"]


class NamedFunctionChoice(_Lenient):
    type: Literal["function"]
    name: str


class TextConfig(_Lenient):
    format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    verbosity: str | None = None  # a hint to OpenAI's models; ignored


class ReasoningConfig(_Lenient):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


# ---------------------------------------------------------------- the request
class ResponsesRequest(RequestBody):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # None: OpenAI's default, 1
    top_p: float | None = Field(None, gt=0.0, le=1.0)  # None: OpenAI's default, 1
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None  # include_obfuscation: nothing to obfuscate, ignored
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None  # accepted, ignored: a model reasons as its chat template makes it
    store: bool | None = None  # accepted, nothing is kept (see engine.server.responses)
    truncation: Literal["disabled", "auto"] | None = None
    metadata: dict[str, str] | None = None  # echoed back
    # accepted and ignored: they steer OpenAI's billing, caching, abuse checks and built-in tools
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    max_tool_calls: int | None = None
    # declared so that a value is refused by name, not dropped
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    background: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise RequestError(f"unknown parameter {unknown[0]!r} for /v1/responses; this server takes "
                                   f"{', '.join(cls.model_fields)}", param=unknown[0])
        return data

    @field_validator("input", mode="before")
    @classmethod
    def _item_types(cls, v: Any) -> Any:
        if isinstance(v, list):
            for i, item in enumerate(v):
                kind = _item_type(item)
                if kind not in INPUT_ITEM_TYPES:
                    raise RequestError(f"input[{i}] has type {kind!r}; this server takes input items of type "
                                       f"{', '.join(INPUT_ITEM_TYPES)}", param="input")
        return v

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, v: Any) -> Any:
        for i, tool in enumerate(v if isinstance(v, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise RequestError(f"tools[{i}] has type {kind!r}; this server runs function tools only "
                                   f"(type 'function': no built-in tools)", param="tools")
        return v

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("type") != "function":
            raise RequestError(f"tool_choice of type {v.get('type')!r} is not supported; send 'none', 'auto', "
                               f"'required' or {{'type': 'function', 'name': ...}}", param="tool_choice")
        return v

    @field_validator("include")
    @classmethod
    def _known_includes(cls, v: list[str] | None) -> list[str] | None:
        for value in v or []:
            if value != INCLUDE_LOGPROBS and value not in INCLUDE_IGNORED:
                raise RequestError(f"include value {value!r} is not known; this server honours "
                                   f"{INCLUDE_LOGPROBS!r}", param="include")
        return v

    def wants_logprobs(self) -> bool:
        return INCLUDE_LOGPROBS in (self.include or [])


# ---------------------------------------------------------------- output
class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = []
    logprobs: list[dict[str, Any]] | None = None  # with include message.output_text.logprobs


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []


class OutputReasoning(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    status: Literal["in_progress", "completed", "incomplete"] = "in_progress"
    summary: list[Any] = []
    content: list[ReasoningText] = []


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = OutputMessage | OutputReasoning | OutputFunctionCall


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # not counted apart: output_tokens includes any reasoning


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem] = []
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float
    top_p: float
    tools: list[dict[str, Any]] = []
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = {"format": {"type": "text"}}
    reasoning: dict[str, Any] = {"effort": None, "summary": None}
    truncation: Literal["disabled"] = "disabled"
    store: Literal[False] = False  # nothing is kept, whatever the request said
    previous_response_id: None = None
    metadata: dict[str, str] = {}
    usage: ResponseUsage | None = None
    msa_eval_timings: Timings = None
