"""POST /v1/chat/completions: non-streaming JSON and streaming server-sent events.

Answers go through `engine.server.chatoutput`: reasoning blocks become `reasoning_content`, tool
calls `tool_calls`. Streamed, text deltas are sent as soon as they are safe (engine.textstream,
then chatoutput: with tools offered, content from where a call may begin is held to the end, when
it is sent as content or as tool_calls deltas); the streamed fields equal the non-streamed ones.
With `logprobs: true` (and `top_logprobs: K` alternatives) every generated token's log p comes from
the engine's rows (`SamplingParams.logprobs`, the same rows as /v1/completions' logprobs) in OpenAI's
`choices[0].logprobs.content` shape; streamed, each chunk carries the tokens generated since the last.
`response_format` (json_object, json_schema) holds the answer to JSON through constrained decoding
(`engine.server.response_format` -> `SamplingParams.constraint`, `engine.constrained`).
`temperature` / `top_p` left out or null are OpenAI's defaults, 1 and 1: the answer is sampled (send
temperature 0 for greedy). `start_chat` is also the way in of /v1/responses (engine.server.responses).
The server's timing split goes out in `msa_eval_timings` (engine.server.timings): in the body, or in
the last chunk (the usage chunk when `stream_options.include_usage`, else the finish_reason chunk).
"""
from __future__ import annotations

import asyncio
import dataclasses
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
from engine.server.logprobs import chat_logprobs
from engine.server.reasoning import prompt_opens_block
from engine.server.response_format import response_constraint
from engine.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatLogprobs,
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


async def start_chat(req: ChatCompletionRequest, state: ServingState, request_id: str
                     ) -> tuple[Generation, ChatOutputParser]:
    """Validate and render a chat request and admit its engine request (the one way in for every route that
    generates a chat answer: /v1/chat/completions and /v1/responses); the parser splits the answer."""
    state.check_model(req.model)
    reject_unsupported(req)
    tok = state.llm.tokenizer  # a schema is compiled (and a bad one refused) before the prompt is rendered
    constraint = await asyncio.to_thread(response_constraint, req.response_format, tok, state.llm.config.vocab_size)
    prompt_ids = await asyncio.to_thread(state.chat_prompt_ids, req)  # off the event loop: long prompts take a while
    max_new = state.check_length(len(prompt_ids), req.max_new_tokens(), "messages")
    parser = _output_parser(req, state, prompt_ids)
    top = (req.top_logprobs or 0) if req.logprobs else None  # engine rows: the token and `top` alternatives
    params = state.sampling_params(req, max_new, logprobs=top)
    if constraint is not None:
        params = dataclasses.replace(params, constraint=constraint)
    gen = Generation(state, request_id, prompt_ids, params, req.stop_strings())
    return gen, parser


async def chat_completions(req: ChatCompletionRequest, http_request: Request, state: ServingState):
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    gen, parser = await start_chat(req, state, request_id)
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
        choices=[ChatChoice(index=0, message=message, finish_reason=_finish(parsed, gen),
                            logprobs=LogprobsCursor(gen).take(even_empty=True))],
        msa_eval_timings=gen.timings,
    )


class LogprobsCursor:
    """The chat logprobs of the generated tokens not yet sent (every token's, reasoning and tool-call markup
    included; none past the token that ended the text at a stop string), in order: streamed chunks
    concatenate to the non-streamed list."""

    def __init__(self, gen: Generation) -> None:
        self.gen, self.sent = gen, 0

    def take(self, even_empty: bool = False) -> ChatLogprobs | None:
        """The rows since the last take; None when logprobs were not asked for, or there are none new
        (an empty list with `even_empty`: a non-streamed answer of no tokens)."""
        if self.gen.params.logprobs is None:
            return None
        n = min(len(self.gen.token_logprobs), len(self.gen.token_ids))
        if n <= self.sent and not even_empty:
            return None
        ids, rows = self.gen.token_ids[self.sent:n], self.gen.token_logprobs[self.sent:n]
        self.sent = max(n, self.sent)
        return chat_logprobs(self.gen.state.llm.tokenizer, ids, rows)


def _text_delta(field: str, text: str) -> ChatDelta:
    return ChatDelta(reasoning_content=text) if field == "reasoning_content" else ChatDelta(content=text)


def _event(obj) -> str:
    return f"data: {obj.model_dump_json(exclude_none=True)}\n\n"


async def _sse(gen: Generation, model: str, parser: ChatOutputParser, include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    cursor = LogprobsCursor(gen)

    def chunk(delta: ChatDelta, finish: str | None = None, timings: dict[str, float] | None = None,
              logprobs: ChatLogprobs | None = None) -> str:
        choice = ChunkChoice(index=0, delta=delta, finish_reason=finish, logprobs=logprobs)
        return _event(ChatCompletionChunk(id=gen.request_id, created=created, model=model, choices=[choice],
                                          msa_eval_timings=timings))

    yield chunk(ChatDelta(role="assistant", content=""))
    try:
        async for piece in gen.deltas():
            for field, text in parser.feed(piece):
                yield chunk(_text_delta(field, text), logprobs=cursor.take())
        rest, parsed = parser.finish()
        for field, text in rest:
            yield chunk(_text_delta(field, text), logprobs=cursor.take())
        for i, c in enumerate(parsed.tool_calls):
            fn = ToolCallFunction(name=c.name, arguments=c.arguments)
            yield chunk(ChatDelta(tool_calls=[DeltaToolCall(index=i, id=c.id, type="function", function=fn)]),
                        logprobs=cursor.take())
        finish = _finish(parsed, gen)
    except ApiError as e:  # the status line is already sent: report in-band, OpenAI style
        yield f"data: {json.dumps(e.body())}\n\n"
        return
    yield chunk(ChatDelta(), finish, None if include_usage else gen.timings, logprobs=cursor.take())
    if include_usage:
        yield _event(ChatCompletionChunk(id=gen.request_id, created=created, model=model, choices=[],
                                         usage=_usage(gen), msa_eval_timings=gen.timings))
    yield "data: [DONE]\n\n"
