"""POST /v1/responses (OpenAI's Responses API) on the chat path: one request in, one chat answer out.

`chat_request` maps the Responses body onto a `ChatCompletionRequest` (validated as chat validates
it), `engine.server.chat.start_chat` renders and admits it, and the chat output parser
(`engine.server.chatoutput`) splits the answer; `Output` turns the parser's deltas into Responses
output items and, streamed, into the typed server-sent events the openai SDK parses
(`response.created`, `response.in_progress`, `response.output_item.added`,
`response.content_part.added`, `response.output_text.delta` / `response.reasoning_text.delta`, their
`.done`s, `response.function_call_arguments.delta`/`.done`, `response.output_item.done`, and last
`response.completed`, or `response.incomplete` when the answer was cut at its token limit, or
`error` + `response.failed` when the engine failed). The non-streamed body is built by the same
`Output`, so the streamed deltas concatenate to its text.

The mapping:
  * `instructions` -> a leading system message; `input` as a string -> one user message; items:
    `message` (roles user, system, developer, assistant; text parts `input_text`, `output_text`,
    `refusal`; images and files are refused) -> chat messages; `function_call` -> the assistant turn's
    `tool_calls` (a call after an assistant message joins it: one turn); `function_call_output` -> a
    `tool` message (its call_id must belong to an earlier function_call); `reasoning` -> the next
    assistant turn's `reasoning_content` (encrypted reasoning cannot be read and is dropped).
  * `tools` (flat function tools) and `tool_choice` -> chat's tools, rendered as chat renders them
    (engine.server.toolcalls: a prompt convention, not constrained decoding).
  * `max_output_tokens` (>= 1; OpenAI's minimum is 16) -> max_completion_tokens (none: the server's
    --default-max-tokens);
    `temperature` / `top_p` left out -> OpenAI's defaults, 1 and 1 (set temperature 0 for greedy).
  * `text.format` -> chat's `response_format` (whatever chat supports; refused there by name).
  * `include: ["message.output_text.logprobs"]` (+ `top_logprobs`) -> the logprobs of every generated
    token (reasoning and call markup included, as chat's) on the message's output_text.
  * Output: a `reasoning` item when the server splits reasoning (--reasoning-parser), a `message`
    with one `output_text` (always, unless the answer is only tool calls), one `function_call` item per
    parsed call; `usage` input/output/total tokens (no cached or reasoning split: 0);
    `status: "incomplete"` with `incomplete_details.reason: "max_output_tokens"` when the limit cut it.
  * Nothing is stored: `store` is accepted either way (OpenAI's default is true) and the response says
    `store: false`; `previous_response_id`, `conversation` and `prompt` need stored state and are a 400
    naming them (send the whole conversation in `input`), and GET /v1/responses/{id} is a 404 saying so.
    `reasoning` (effort, summary) is accepted and ignored: a model reasons as its chat template makes it.
    `truncation: "auto"` and `background: true` are refused by name.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask

from engine.server.chat import LogprobsCursor, start_chat
from engine.server.chatoutput import Delta
from engine.server.errors import ApiError
from engine.server.generation import Generation
from engine.server.jsonguard import RequestError
from engine.server.responses_schemas import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    IncompleteDetails,
    MessageItem,
    NamedFunctionChoice,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputText,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from engine.server.schemas import ChatCompletionRequest
from engine.server.state import ServingState
from engine.server.toolcalls import ParsedToolCall

Status = Literal["in_progress", "completed", "incomplete", "failed"]
# chat's parameter names -> the Responses names a client sent (for errors raised on the chat path)
_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


def _text(parts: str | list[ContentPart], where: str) -> str:
    if isinstance(parts, str):
        return parts
    out = []
    for j, p in enumerate(parts):
        if p.type in ("input_text", "output_text", "text", "summary_text", "reasoning_text") and p.text is not None:
            out.append(p.text)
        elif p.type == "refusal" and p.refusal is not None:
            out.append(p.refusal)
        else:
            raise RequestError(f"{where}[{j}] has type {p.type!r}; this server takes text only (input_text, "
                               f"output_text, refusal)", param="input")
    return "".join(out)


def chat_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The Responses `instructions` + `input` as chat messages (OpenAI-shaped dicts)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return [*messages, {"role": "user", "content": req.input}]
    turn_calls: set[str] = set()  # the call ids of the latest assistant turn: what outputs may answer
    reasoning: str | None = None
    open_turn = False  # the last message is an assistant turn that later function_call items join
    for i, item in enumerate(req.input):
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _text(item.content, f"input[{i}].content")})
            open_turn, turn_calls = item.role == "assistant", set()
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if not open_turn:
                messages.append({"role": "assistant", "content": None})
                open_turn, turn_calls = True, set()
            messages[-1].setdefault("tool_calls", []).append(call)
            turn_calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in turn_calls:
                raise RequestError(f"input[{i}] is the function_call_output of call_id {item.call_id!r}, which is "
                                   f"not among the function_call items just before it; send each turn's calls, "
                                   f"then their outputs", param="input")
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text(item.output, f"input[{i}].output")})
            open_turn = False
        else:  # reasoning: held for the assistant turn it belongs to
            reasoning = _text(item.content if item.content is not None else item.summary,
                              f"input[{i}].content") or None
            continue
        if reasoning is not None and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"], reasoning = reasoning, None
    return messages


def _refuse_unsupported(req: ResponsesRequest) -> None:
    for name in ("previous_response_id", "conversation", "prompt"):
        if getattr(req, name) is not None:
            raise ApiError(400, f"{name} needs stored responses, and this server stores none; send the whole "
                                f"conversation in input", param=name)
    if req.background:
        raise ApiError(400, "background responses are not supported; leave background out", param="background")
    if req.truncation == "auto":
        raise ApiError(400, "truncation 'auto' is not supported (the server never drops input); leave it out or "
                            "send 'disabled'", param="truncation")
    if req.top_logprobs is not None and not req.wants_logprobs():
        raise ApiError(400, "top_logprobs needs include ['message.output_text.logprobs']", param="top_logprobs")


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = (req.text.format if req.text else None) or {"type": "text"}
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return fmt if fmt.get("type") != "text" else None


def _renamed(e: ApiError) -> ApiError:
    """An error of the chat path under the parameter names of the Responses request."""
    if e.param not in _PARAMS:
        return e
    message = e.message if e.param == "messages" else e.message.replace(e.param, _PARAMS[e.param])
    return ApiError(e.status, message, param=_PARAMS[e.param], code=e.code, headers=e.headers)


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that answers a Responses request; a 400 naming the parameter when it cannot."""
    _refuse_unsupported(req)
    tools = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
             for t in req.tools or []]
    choice: Any = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        choice = {"type": "function", "function": {"name": choice.name}}
    try:
        messages = chat_messages(req)
    except RequestError as e:
        raise ApiError(400, str(e), param=e.param) from None
    body = {"model": req.model, "messages": messages, "max_completion_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "tools": tools or None, "tool_choice": choice,
            "parallel_tool_calls": req.parallel_tool_calls, "logprobs": req.wants_logprobs() or None,
            "top_logprobs": req.top_logprobs, "response_format": _response_format(req)}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, RequestError):
            raise _renamed(ApiError(400, str(cause), param=cause.param)) from None
        where = ".".join(str(x) for x in first.get("loc", ())).replace("messages", "input (as chat messages)", 1)
        raise ApiError(400, f"invalid request: {where}: {first.get('msg')}", param="input") from None


class Output:
    """The output items of one answer, fed the chat parser's (field, text) deltas; every method returns the
    streamed events (dicts without sequence numbers) of what it added."""

    def __init__(self, logprobs: LogprobsCursor | None = None) -> None:  # None: logprobs not asked for
        self.items: list[OutputItem] = []
        self._open: dict[str, int] = {}  # parser field -> output index of its item
        self._cursor = logprobs
        self._rows: list[dict[str, Any]] | None = [] if logprobs is not None else None

    def _new_rows(self) -> list[dict[str, Any]]:
        got = self._cursor.take() if self._cursor is not None else None
        rows = [t.model_dump() for t in (got.content or [])] if got is not None else []
        if self._rows is not None:
            self._rows += rows
        return rows

    def _open_item(self, field: str) -> list[dict[str, Any]]:
        item: OutputMessage | OutputReasoning
        if field == "content":
            item = OutputMessage(id=f"msg_{uuid.uuid4().hex}", content=[OutputText()])
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
        else:
            item = OutputReasoning(id=f"rs_{uuid.uuid4().hex}", content=[ReasoningText()])
            part = {"type": "reasoning_text", "text": ""}
        index = self._open[field] = len(self.items)
        added = item.model_dump(exclude_none=True) | {"content": []}
        self.items.append(item)
        return [{"type": "response.output_item.added", "output_index": index, "item": added},
                {"type": "response.content_part.added", "item_id": item.id, "output_index": index,
                 "content_index": 0, "part": part}]

    def feed(self, deltas: list[Delta]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for field, text in deltas:
            if field not in self._open:
                events += self._open_item(field)
            index = self._open[field]
            item = self.items[index]
            assert not isinstance(item, OutputFunctionCall)
            item.content[0].text += text
            event = {"item_id": item.id, "output_index": index, "content_index": 0, "delta": text}
            if field == "content":
                events.append({"type": "response.output_text.delta", **event, "logprobs": self._new_rows()})
            else:
                events.append({"type": "response.reasoning_text.delta", **event})
        return events

    def finish(self, calls: list[ParsedToolCall], incomplete: bool) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not calls and "content" not in self._open:  # a text answer always has its message, empty or not
            events += self._open_item("content")
        status: Literal["completed", "incomplete"] = "incomplete" if incomplete else "completed"
        self._new_rows()
        for index in self._open.values():
            item = self.items[index]
            assert not isinstance(item, OutputFunctionCall)
            item.status = status
            part = item.content[0]
            where = {"item_id": item.id, "output_index": index, "content_index": 0}
            if isinstance(part, OutputText):
                part.logprobs = self._rows
                events.append({"type": "response.output_text.done", **where, "text": part.text,
                               "logprobs": self._rows or []})
            else:
                events.append({"type": "response.reasoning_text.done", **where, "text": part.text})
            events.append({"type": "response.content_part.done", **where, "part": part.model_dump(exclude_none=True)})
            events.append({"type": "response.output_item.done", "output_index": index,
                           "item": item.model_dump(exclude_none=True)})
        for c in calls:
            call = OutputFunctionCall(id=f"fc_{uuid.uuid4().hex}", call_id=c.id, name=c.name, arguments=c.arguments)
            index = len(self.items)
            self.items.append(call)
            where = {"item_id": call.id, "output_index": index}
            events += [
                {"type": "response.output_item.added", "output_index": index,
                 "item": call.model_dump() | {"arguments": "", "status": "in_progress"}},
                {"type": "response.function_call_arguments.delta", **where, "delta": c.arguments},
                {"type": "response.function_call_arguments.done", **where, "name": c.name, "arguments": c.arguments},
                {"type": "response.output_item.done", "output_index": index, "item": call.model_dump()},
            ]
        return events


def _response(req: ResponsesRequest, response_id: str, created: int, status: Status, output: Output,
              gen: Generation | None = None, error: ResponseError | None = None) -> ResponseObject:
    finished = gen is not None and status in ("completed", "incomplete")
    usage = None
    if finished:
        p, c = len(gen.prompt_ids), len(gen.token_ids)  # type: ignore[union-attr]
        usage = ResponseUsage(input_tokens=p, output_tokens=c, total_tokens=p + c)
    return ResponseObject(
        id=response_id, created_at=created, status=status, error=error, model=req.model, output=output.items,
        incomplete_details=IncompleteDetails() if status == "incomplete" else None,
        instructions=req.instructions, max_output_tokens=req.max_output_tokens,
        temperature=1.0 if req.temperature is None else req.temperature, top_p=1.0 if req.top_p is None else req.top_p,
        tools=[t.model_dump(exclude_none=True) for t in req.tools or []],
        tool_choice=_echo_choice(req), parallel_tool_calls=req.parallel_tool_calls is not False,
        text={"format": (req.text.format if req.text else None) or {"type": "text"}},
        reasoning=req.reasoning.model_dump() if req.reasoning else {"effort": None, "summary": None},
        metadata=req.metadata or {}, usage=usage, msa_eval_timings=gen.timings if finished else None)  # type: ignore[union-attr]


def _echo_choice(req: ResponsesRequest) -> Any:
    choice = req.tool_choice
    return choice.model_dump() if isinstance(choice, NamedFunctionChoice) else choice or "auto"


def _status(gen: Generation) -> Status:
    return "incomplete" if gen.finish_reason == "length" else "completed"


async def create_response(req: ResponsesRequest, http_request: Request, state: ServingState):
    response_id = f"resp_{uuid.uuid4().hex}"
    chat = chat_request(req)
    try:
        gen, parser = await start_chat(chat, state, response_id)
    except ApiError as e:
        raise _renamed(e) from None
    output = Output(LogprobsCursor(gen) if chat.logprobs else None)
    created = int(time.time())
    if req.stream:
        return StreamingResponse(_sse(req, response_id, created, gen, parser, output), media_type="text/event-stream",
                                 background=BackgroundTask(gen.release))
    output.feed(parser.feed(await gen.run(http_request)))
    rest, parsed = parser.finish()
    output.feed(rest)
    output.finish(parsed.tool_calls, _status(gen) == "incomplete")
    return _response(req, response_id, created, _status(gen), output, gen)


async def _sse(req: ResponsesRequest, response_id: str, created: int, gen: Generation, parser: Any,
               output: Output) -> AsyncIterator[str]:
    sequence = 0

    def sse(events: list[dict[str, Any]]) -> str:
        nonlocal sequence
        out = []
        for ev in events:
            ev["sequence_number"] = sequence
            sequence += 1
            out.append(f"event: {ev['type']}\ndata: {json.dumps(ev, ensure_ascii=False)}\n\n")
        return "".join(out)

    def lifecycle(kind: str, status: Status, error: ResponseError | None = None) -> dict[str, Any]:
        body = _response(req, response_id, created, status, output, gen, error)
        return {"type": kind, "response": body.model_dump(mode="json", exclude_none=True)}

    yield sse([lifecycle("response.created", "in_progress"), lifecycle("response.in_progress", "in_progress")])
    try:
        async for piece in gen.deltas():
            events = output.feed(parser.feed(piece))
            if events:
                yield sse(events)
        rest, parsed = parser.finish()
        status = _status(gen)
        yield sse(output.feed(rest) + output.finish(parsed.tool_calls, status == "incomplete"))
    except ApiError as e:  # the status line is already sent: report in-band, as OpenAI does
        failed = ResponseError(code="server_error", message=e.message)
        yield sse([{"type": "error", "code": e.code, "message": e.message, "param": e.param},
                   lifecycle("response.failed", "failed", failed)])
        return
    yield sse([lifecycle("response.completed" if status == "completed" else "response.incomplete", status)])


def not_stored(response_id: str) -> ApiError:
    """GET /v1/responses/{id}: nothing is kept, so every id is unknown (a 404 that says why)."""
    return ApiError(404, f"response {response_id!r} is not stored: this server keeps no responses (store is "
                         f"ignored); use the body the POST returned", param="response_id", code="not_found")
