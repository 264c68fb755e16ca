"""POST /v1/chat/completions: non-streaming JSON and streaming server-sent events.

Answers go through `engine.server.chatoutput`: reasoning blocks become `reasoning_content`, tool
calls `tool_calls`. Streamed, text deltas are sent as soon as they are safe (engine.textstream,
then chatoutput: with tools offered, content from where a call may begin is held to the end, when
it is sent as content or as tool_calls deltas); the streamed fields equal the non-streamed ones.
The server's timing split goes out in `msa_eval_timings` (engine.server.timings): in the body, or in
the last chunk (the usage chunk when `stream_options.include_usage`, else the finish_reason chunk).
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

from engine.server.chatoutput import ChatOutput, ChatOutputParser
from engine.server.errors import ApiError
from engine.server.generation import Generation
from engine.server.reasoning import prompt_opens_block
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


def _offered_tools(req: ChatCompletionRequest) -> dict[str, object]:
    """Offered tool name -> its parameters schema (empty when none are offered or tool_choice is none)."""
    if not req.tools or req.tool_choice == "none":
        return {}
    return {t.function.name: t.function.parameters for t in req.tools}


def _output_parser(req: ChatCompletionRequest, state: ServingState, prompt_ids: list[int]) -> ChatOutputParser:
    tags = state.reasoning
    inside = False
    if tags is not None:  # the prompt's tail is enough to see whether the template opened a block
        inside = prompt_opens_block(state.llm.tokenizer.decode(prompt_ids[-16:], skip_special_tokens=False), tags)
    return ChatOutputParser(_offered_tools(req), tags, inside)


def _usage(gen: Generation) -> Usage:
    p, c = len(gen.prompt_ids), len(gen.token_ids)
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c)


def _finish(parsed: ChatOutput, gen: Generation) -> str:
    return "tool_calls" if parsed.tool_calls else (gen.finish_reason or "stop")


async def chat_completions(req: ChatCompletionRequest, http_request: Request, state: ServingState):
    state.check_model(req.model)
    reject_unsupported(req)
    prompt_ids = await asyncio.to_thread(state.chat_prompt_ids, req)  # off the event loop: long prompts take a while
    max_new = state.check_length(len(prompt_ids), req.max_new_tokens())
    parser = _output_parser(req, state, prompt_ids)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    gen = Generation(state, request_id, prompt_ids, state.sampling_params(req, max_new), req.stop_strings())
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(gen, req.model, parser, include_usage), media_type="text/event-stream",
                                 background=BackgroundTask(gen.release))
    parser.feed(await gen.run(http_request))
    _, parsed = parser.finish()
    calls = [ToolCallModel(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.arguments))
             for c in parsed.tool_calls] or None
    message = AssistantMessage(content=parsed.content, reasoning_content=parsed.reasoning_content, tool_calls=calls)
    return ChatCompletion(
        id=request_id, created=int(time.time()), model=req.model, usage=_usage(gen),
        choices=[ChatChoice(index=0, message=message, finish_reason=_finish(parsed, gen))],
        msa_eval_timings=gen.timings,
    )


def _text_delta(field: str, text: str) -> ChatDelta:
    return ChatDelta(reasoning_content=text) if field == "reasoning_content" else ChatDelta(content=text)


def _event(obj) -> str:
    return f"data: {obj.model_dump_json(exclude_none=True)}\n\n"


async def _sse(gen: Generation, model: str, parser: ChatOutputParser, include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(delta: ChatDelta, finish: str | None = None, timings: dict[str, float] | None = None) -> str:
        return _event(ChatCompletionChunk(id=gen.request_id, created=created, model=model,
                                          choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish)],
                                          msa_eval_timings=timings))

    yield chunk(ChatDelta(role="assistant", content=""))
    try:
        async for piece in gen.deltas():
            for field, text in parser.feed(piece):
                yield chunk(_text_delta(field, text))
        rest, parsed = parser.finish()
        for field, text in rest:
            yield chunk(_text_delta(field, text))
        for i, c in enumerate(parsed.tool_calls):
            fn = ToolCallFunction(name=c.name, arguments=c.arguments)
            yield chunk(ChatDelta(tool_calls=[DeltaToolCall(index=i, id=c.id, type="function", function=fn)]))
        finish = _finish(parsed, gen)
    except ApiError as e:  # the status line is already sent: report in-band, OpenAI style
        yield f"data: {json.dumps(e.body())}\n\n"
        return
    yield chunk(ChatDelta(), finish, None if include_usage else gen.timings)
    if include_usage:
        yield _event(ChatCompletionChunk(id=gen.request_id, created=created, model=model, choices=[],
                                         usage=_usage(gen), msa_eval_timings=gen.timings))
    yield "data: [DONE]\n\n"
