"""One engine request seen from a route: text deltas out, timings and counts kept on the object."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from engine.server.errors import ApiError
from engine.server.state import ServingState
from engine.textstream import IncrementalText


class ClientDisconnected(Exception):
    """The HTTP client went away; its engine request has been aborted."""


class Generation:
    """Drive one request through the engine bridge; `deltas()` yields safe-to-emit text.

    After `deltas()` is exhausted: `text` (final output, cut before a stop string),
    `token_ids` (tokens generated up to the stop), `finish_reason` ("stop" | "length"), and, when
    the params asked for them, `prompt_logprobs` and `token_logprobs` (one row per generated token,
    possibly past a stop string: cut them to `token_ids`). An engine error on this request raises
    `ApiError` 500 (code engine_error) from `deltas()`; other requests are not affected.
    `timings`: the server's timing split (`engine.server.timings`), None until the engine finished it.
    """

    def __init__(self, state: ServingState, request_id: str, prompt_ids: list[int], params: Any,
                 stop: list[str]) -> None:
        self.state, self.request_id, self.prompt_ids, self.params = state, request_id, prompt_ids, params
        self._text = IncrementalText(state.llm.tokenizer, stop)
        self.finish_reason: str | None = None
        self.ttft_s: float | None = None
        self.prompt_logprobs: list | None = None
        self.token_logprobs: list = []
        self.timings: dict[str, float] | None = None
        state.engine.reserve()  # QueueFullError -> 429 before any byte is sent
        self._reserved = True

    def release(self) -> None:
        """Give the admission slot back (idempotent; also called if streaming never starts)."""
        if self._reserved:
            self._reserved = False
            self.state.engine.release()

    @property
    def text(self) -> str:
        return self._text.text

    @property
    def token_ids(self) -> list[int]:
        return self._text.token_ids

    async def deltas(self) -> AsyncIterator[str]:
        m = self.state.metrics
        start = time.perf_counter()
        m.prompt_tokens.inc(len(self.prompt_ids))
        events = self.state.engine.stream(self.request_id, self.prompt_ids, self.params)
        try:
            async for ev in events:
                if ev.timings is not None:
                    self.timings = ev.timings
                if ev.error:
                    raise ApiError(500, f"the engine failed on this request: {ev.error}", code="engine_error")
                if ev.prompt_logprobs is not None:
                    self.prompt_logprobs = ev.prompt_logprobs
                self.token_logprobs += ev.logprobs or []
                if ev.new_token_ids and self.ttft_s is None:
                    self.ttft_s = time.perf_counter() - start
                    m.ttft.observe(self.ttft_s)
                m.generation_tokens.inc(len(ev.new_token_ids))
                piece = self._text.add(ev.new_token_ids)
                if piece:
                    yield piece
                if self._text.stopped:
                    self.finish_reason = "stop"
                    break
                if ev.finished:
                    self.finish_reason = ev.finish_reason or "stop"
                    break
            tail = self._text.flush()
            if tail:
                yield tail
        finally:
            await events.aclose()  # aborts the engine request when it has not finished
            self.release()
            n = len(self.token_ids)
            if self.ttft_s is not None and n > 1:
                m.tpot.observe((time.perf_counter() - start - self.ttft_s) / (n - 1))

    async def run(self, http_request: Request | None = None, poll_s: float = 0.25) -> str:
        """Generate to the end; abort and raise `ClientDisconnected` if the client goes away."""

        async def consume() -> str:
            return "".join([piece async for piece in self.deltas()])

        task = asyncio.create_task(consume())
        try:  # the handler itself may be cancelled too: never leave the task running
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll_s)
                if done:
                    return task.result()
                if http_request is not None and await http_request.is_disconnected():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    raise ClientDisconnected(self.request_id)
        finally:
            if not task.done():
                task.cancel()
            self.release()
