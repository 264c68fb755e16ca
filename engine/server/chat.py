"""POST /v1/chat/completions: non-streaming JSON and streaming server-sent events.

With tools offered the streamed answer is buffered and sent at the end (as content or as
tool_calls deltas), because whether the text is a call is only known once it is complete.
Without tools, text deltas are sent as soon as they are safe (see engine.textstream).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from engine.server.errors import ApiError
from engine.server.generation import Generation
from engine.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChunkChoice,
    DeltaToolCall,
    ToolCallFunction,
    ToolCallModel,
    Usage,
)
from engine.server.state import ServingState, reject_unsupported
from engine.server.toolcalls import ParsedOutput, parse_tool_calls


def _offered_tool_names(req: ChatCompletionRequest) -> set[str]:
    if not req.tools or req.tool_choice == "none":
        return set()
    return {t.function.name for t in req.tools}


def _usage(gen: Generation) -> Usage:
    p, c = len(gen.prompt_ids), len(gen.token_ids)
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def _finish(parsed: ParsedOutput, gen: Generation) -> str:
    return "tool_calls" if parsed.tool_calls else (gen.finish_reason or "stop")


async def chat_completions(req: ChatCompletionRequest, http_request: Request, state: ServingState):
    state.check_model(req.model)
    reject_unsupported(req)
    prompt_ids = await asyncio.to_thread(state.chat_prompt_ids, req)  # off the event loop: long prompts take a while
    max_new = state.check_length(len(prompt_ids), req.max_new_tokens())
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    gen = Generation(state, request_id, prompt_ids, state.sampling_params(req, max_new), req.stop_strings())
    tool_names = _offered_tool_names(req)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(gen, req.model, tool_names, include_usage), media_type="text/event-stream",
                                 background=BackgroundTask(gen.release))
    text = await gen.run(http_request)
    parsed = parse_tool_calls(text, tool_names)
    calls = [ToolCallModel(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments))
             for c in parsed.tool_calls] or None
    return ChatCompletion(
        id=request_id, created=int(time.time()), model=req.model, usage=_usage(gen),
        choices=[ChatChoice(index=0, message=AssistantMessage(content=parsed.content, tool_calls=calls),
                            finish_reason=_finish(parsed, gen))],
    )


def _event(obj) -> str:
    return f"data: {obj.model_dump_json(exclude_none=True)}\n\n"


async def _sse(gen: Generation, model: str, tool_names: set[str], include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(delta: ChatDelta, finish: str | None = None) -> str:
        return _event(ChatCompletionChunk(id=gen.request_id, created=created, model=model,
                                          choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)]))

    yield chunk(ChatDelta(role="assistant", content=""))
    try:
        if not tool_names:
            async for piece in gen.deltas():
                yield chunk(ChatDelta(content=piece))
            finish = gen.finish_reason or "stop"
        else:
            text = "".join([piece async for piece in gen.deltas()])
            parsed = parse_tool_calls(text, tool_names)
            if parsed.content:
                yield chunk(ChatDelta(content=parsed.content))
            for i, c in enumerate(parsed.tool_calls):
                fn = ToolCallFunction(name=c.name, arguments=c.arguments)
                yield chunk(ChatDelta(tool_calls=[DeltaToolCall(index=i, id=c.id, type="function", function=fn)]))
            finish = _finish(parsed, gen)
    except ApiError as e:  # the status line is already sent: report in-band, OpenAI style
        yield f"data: {json.dumps(e.body())}\n\n"
        return
    yield chunk(ChatDelta(), finish)
    if include_usage:
        yield _event(ChatCompletionChunk(id=gen.request_id, created=created, model=model, choices=[],
                                         usage=_usage(gen)))
    yield "data: [DONE]\n\n"
