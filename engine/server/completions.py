"""POST /v1/completions: text or token-id prompts, `echo`, and `logprobs` (for lm-eval).

lm-eval's `local-completions` scores a continuation by sending prompt = context +
continuation with echo=True, logprobs=1, max_tokens=1 (or 0) and reading `token_logprobs` over
the prompt positions. Each prompt is ONE engine request that generates and scores together
(`SamplingParams.logprobs` / `prompt_logprobs`, `engine.scoring`): prompt rows are computed in
the request's own prefill chunks, scheduled between other requests' steps like any prefill, so
a long scoring request never holds the engine; entry 0 is None (no context). Generated-token
logprobs come from the logits each token was sampled from: log p under the model's full
distribution, before temperature/top-p. max_tokens=0 with echo scores the prompt only.
Several prompts in one request become several choices; streaming takes one prompt only.
`temperature` / `top_p` left out or null are OpenAI's defaults, 1 and 1 (sampling; send 0 for greedy).
The server's timing split goes out in `msa_eval_timings` (engine.server.timings): in the body (one
prompt), in each choice (several), or streamed in the last chunk (the usage chunk with
`stream_options.include_usage`, else the finish_reason chunk).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from engine.server.errors import ApiError
from engine.server.generation import Generation
from engine.server.logprobs import completion_logprobs
from engine.server.schemas import Completion, CompletionChoice, CompletionRequest, Usage
from engine.server.state import ServingState, reject_unsupported


def _prompts(req: CompletionRequest, state: ServingState) -> list[list[int]]:
    """The request's prompts as token ids (blocking: tokenises; call through `asyncio.to_thread`)."""
    p = req.prompt
    many = isinstance(p, list) and bool(p) and not isinstance(p[0], int)  # list[str] or list[list[int]]
    count = len(p) if many else int(bool(p))
    capacity = state.engine.capacity
    if count > capacity:  # could never be admitted at once: not a 429 "retry later"
        raise ApiError(400, f"this request has {count} prompts, but the server admits at most {capacity} requests at "
                            f"once (--max-batch + --max-queue); send at most {capacity} prompts per request",
                       param="prompt", code="too_many_prompts")
    if isinstance(p, str):
        prompts = [state.prompt_ids(p, True, "prompt")]
    elif not p:
        prompts = []
    elif isinstance(p[0], str):
        prompts = [state.prompt_ids(s, True, "prompt") for s in p]  # type: ignore[arg-type]
    elif isinstance(p[0], int):
        prompts = [list(p)]  # type: ignore[arg-type]
    else:
        prompts = [list(x) for x in p]  # type: ignore[union-attr]
    if not prompts or any(len(x) == 0 for x in prompts):
        raise ApiError(400, "prompt must be non-empty text or token ids", param="prompt")
    vocab = getattr(state.llm.tokenizer, "vocab_size", None)
    if vocab and any(not 0 <= t < vocab for x in prompts for t in x):
        raise ApiError(400, f"prompt token ids must lie in 0..{vocab - 1}", param="prompt")
    return prompts


def _engine_params(state: ServingState, req: CompletionRequest, max_new: int) -> Any:
    """One prompt's engine request: generation and, with `logprobs`, its scoring (the prompt's rows when
    echoed); None when there is nothing to run (max_tokens 0 without echo + logprobs)."""
    if req.logprobs is None or (max_new == 0 and not req.echo):
        return state.sampling_params(req, max_new) if max_new > 0 else None
    return state.sampling_params(req, max_new, logprobs=req.logprobs,
                                 prompt_logprobs=req.logprobs if req.echo else None)


async def _one(state: ServingState, req: CompletionRequest, index: int, prompt_ids: list[int],
               gen: Generation | None, http_request: Request, own_timings: bool) -> tuple[CompletionChoice, int]:
    text, gen_ids, finish = "", [], "length"
    if gen is not None:
        text = await gen.run(http_request)
        gen_ids, finish = list(gen.token_ids), gen.finish_reason or "stop"
    prefix = state.llm.tokenizer.decode(prompt_ids, skip_special_tokens=False) if req.echo else ""
    logprobs = None
    if req.logprobs is not None:  # rows from the same engine request (stop-string tail cut with the tokens)
        ids = (prompt_ids if req.echo else []) + gen_ids
        rows = ((gen.prompt_logprobs or []) if req.echo and gen else []) + (gen.token_logprobs if gen else [])
        logprobs = completion_logprobs(state.llm.tokenizer, ids, rows[:len(ids)])
    timings = gen.timings if own_timings and gen is not None else None
    return CompletionChoice(index=index, text=prefix + text, finish_reason=finish, logprobs=logprobs,
                            msa_eval_timings=timings), len(gen_ids)


async def completions(req: CompletionRequest, http_request: Request, state: ServingState):
    state.check_model(req.model)
    reject_unsupported(req)
    prompts = await asyncio.to_thread(_prompts, req, state)  # off the event loop: long prompts take a while
    max_new = [state.check_length(len(p), req.max_tokens, "prompt") for p in prompts]
    if req.stream:
        if len(prompts) != 1 or req.echo or req.logprobs is not None:
            raise ApiError(400, "streaming completions take one prompt without echo or logprobs", param="stream")
        gen = Generation(state, f"cmpl-{uuid.uuid4().hex}", prompts[0], state.sampling_params(req, max_new[0]),
                         req.stop_strings())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(_sse(gen, req.model, include_usage), media_type="text/event-stream",
                                 background=BackgroundTask(gen.release))
    gens: list[Generation | None] = []
    try:  # reserve every prompt's slot before generating any (all or nothing -> 429)
        for p, m in zip(prompts, max_new, strict=True):
            sp = _engine_params(state, req, m)
            gens.append(Generation(state, f"cmpl-{uuid.uuid4().hex}", p, sp, req.stop_strings()) if sp else None)
    except BaseException:
        for g in gens:
            if g is not None:
                g.release()
        raise
    try:
        several = len(prompts) > 1  # each choice carries its own timings; one prompt: the body does
        results = await asyncio.gather(*(_one(state, req, i, p, g, http_request, several)
                                         for i, (p, g) in enumerate(zip(prompts, gens, strict=True))))
    finally:
        for g in gens:
            if g is not None:
                g.release()
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(n for _, n in results)
    single = gens[0] if len(gens) == 1 else None
    return Completion(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=req.model,
                      choices=[c for c, _ in results],
                      usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                  total_tokens=prompt_tokens + completion_tokens),
                      msa_eval_timings=single.timings if single is not None else None)


async def _sse(gen: Generation, model: str, include_usage: bool) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(text: str, finish: str | None, timings: dict[str, float] | None = None) -> str:
        c = Completion(id=gen.request_id, created=created, model=model,
                       choices=[CompletionChoice(index=0, text=text, finish_reason=finish)], msa_eval_timings=timings)
        drop: dict = {"choices": {"__all__": {"msa_eval_timings"}}}  # one prompt: the chunk carries them
        if timings is None:
            drop["msa_eval_timings"] = True
        return f"data: {c.model_dump_json(exclude=drop)}\n\n"

    try:
        async for piece in gen.deltas():
            yield chunk(piece, None)
    except ApiError as e:
        yield f"data: {json.dumps(e.body())}\n\n"
        return
    yield chunk("", gen.finish_reason or "stop", None if include_usage else gen.timings)
    if include_usage:
        p, c = len(gen.prompt_ids), len(gen.token_ids)
        u = Completion(id=gen.request_id, created=created, model=model, choices=[],
                       usage=Usage(prompt_tokens=p, completion_tokens=c, total_tokens=p + c),
                       msa_eval_timings=gen.timings)
        yield f"data: {u.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"
