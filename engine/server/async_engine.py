"""The bridge between asyncio request handlers and the engine's single driving thread.

`LLMEngine` is not thread-safe and must be driven from ONE thread. `AsyncEngine` owns that
thread: handlers put commands (add a request, abort one) on a thread-safe queue; the thread
applies them, calls `engine.step()` while anything is unfinished, hands each `StepOutput`
to the asyncio queue of its request through `loop.call_soon_threadsafe`, and drops the requests
that ended (`engine.pop_finished`; `LLMEngine.stream` is the same loop without the commands).
All concurrent requests, scoring ones included (prompt log-probs are part of a request's
prefill), are therefore batched by the engine's own scheduler (continuous batching).

Failures: the engine ends a request it could not serve with an error output, which reaches
that request's stream only. Should `step()` itself raise (a bug in the engine's bookkeeping),
every request in flight is failed and aborted, and the loop goes on serving new ones.

Timings: the finishing event of a request carries its timing split (`engine.server.timings`: queue,
prefill, decode, TTFT from the moment the route handed it over), taken from the engine's state of
the request as the thread drops it.

Admission control: a route reserves a slot before it answers (so a full server can still
say 429 in the status line); at most `capacity` requests (running + waiting) hold slots. A
handler that stops listening (client disconnect, cancellation) aborts its engine request in
the `finally` of `stream`.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from engine.server.timings import request_timings


class QueueFullError(RuntimeError):
    """The server already holds `capacity` requests."""


@dataclass
class StreamEvent:
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list | None = None  # rows of the new tokens (engine.scoring.LogprobRow)
    prompt_logprobs: list | None = None  # on the first event of a request that asked for them
    timings: dict[str, float] | None = None  # on the finishing event (engine.server.timings)


@dataclass
class _Sink:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    def __init__(
        self,
        engine: Any,
        capacity: int,
        on_step: Callable[[Any], None] | None = None,
        on_abort: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self.capacity = capacity
        self._on_step = on_step  # called in the engine thread after every step (metrics)
        self._on_abort = on_abort  # called on the event loop when a request is abandoned unfinished
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}
        self._submitted: dict[str, float] = {}  # engine thread only: when each held request was handed over
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.admitted = 0  # touched only from the event loop thread
        self.waiting_first_token: set[str] = set()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------ event-loop side
    def reserve(self) -> None:
        """Take one admission slot (before the HTTP status is sent); QueueFullError when none is left."""
        if self.admitted >= self.capacity:
            raise QueueFullError(f"server is at capacity ({self.capacity} requests running or queued)")
        self.admitted += 1

    def release(self) -> None:
        """Give back a slot taken by `reserve` (once per reservation)."""
        self.admitted -= 1

    async def stream(self, request_id: str, prompt_ids: list[int], params: Any) -> AsyncIterator[StreamEvent]:
        """Run one request (its slot already reserved) and yield its events until it finishes.

        If the caller stops early (disconnect, cancellation, stop string), the engine request
        is aborted in the `finally`.
        """
        sink = _Sink(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            self._sinks[request_id] = sink
        self.waiting_first_token.add(request_id)
        self._commands.put(("add", request_id, prompt_ids, params, time.perf_counter()))
        finished = False
        try:
            while not finished:
                event: StreamEvent = await sink.queue.get()
                self.waiting_first_token.discard(request_id)
                finished = event.finished
                yield event
        finally:
            with self._lock:
                self._sinks.pop(request_id, None)
            self.waiting_first_token.discard(request_id)
            if not finished:
                self._commands.put(("abort", request_id))
                if self._on_abort is not None:
                    self._on_abort()

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    # ------------------------------------------------------------ engine thread
    def _deliver(self, request_id: str, event: StreamEvent) -> None:
        with self._lock:
            sink = self._sinks.get(request_id)
        if sink is not None:
            sink.loop.call_soon_threadsafe(sink.queue.put_nowait, event)

    def _apply(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            _, request_id, prompt_ids, params, submitted = cmd
            try:
                self._engine.add_request(request_id, prompt_ids, params)
            except Exception as e:  # noqa: BLE001 - a bad request must not kill the loop
                self._deliver(request_id, StreamEvent([], True, None, f"{type(e).__name__}: {e}"))
                return
            self._submitted[request_id] = submitted
        elif kind == "abort":
            self._submitted.pop(cmd[1], None)
            try:
                self._engine.abort(cmd[1])
            except Exception:  # noqa: BLE001 - already finished or never added
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:  # idle: sleep until a command arrives; busy: only take what is there
                cmd = self._commands.get_nowait() if self._engine.has_unfinished() else self._commands.get()
            except queue.Empty:
                cmd = None
            while cmd is not None:
                self._apply(cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if self._stop.is_set() or not self._engine.has_unfinished():
                continue
            try:
                outputs = self._engine.step()
            except Exception as e:  # noqa: BLE001 - the loop goes on: every request in flight gets the error
                self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
                continue
            for out in outputs:
                timings = self._forget(out.request_id) if out.finished else None
                self._deliver(out.request_id, StreamEvent(list(out.new_token_ids), bool(out.finished),
                                                          out.finish_reason, out.error, out.logprobs,
                                                          out.prompt_logprobs, timings))
            if self._on_step is not None:
                self._on_step(self._engine)

    def _forget(self, request_id: str) -> dict[str, float] | None:
        """Drop a finished request from the engine (`pop_finished`: its tokens and an ended-with-error
        request's error go out in its events, so the engine's `finish` result is not needed) and
        return its timing split (None when the engine does not hold it)."""
        submitted = self._submitted.pop(request_id, None)
        try:
            seq = self._engine.pop_finished(request_id)
        except KeyError:  # never added, or already dropped
            return None
        try:
            return request_timings(seq, submitted)
        except Exception:  # noqa: BLE001 - timings are a report, never a reason to lose the answer
            return None

    def _fail_all(self, message: str) -> None:
        with self._lock:
            ids = list(self._sinks)
        for request_id in ids:
            self._submitted.pop(request_id, None)
            try:
                self._engine.abort(request_id)
            except Exception:  # noqa: BLE001 - already finished or never added
                pass
            self._deliver(request_id, StreamEvent([], True, None, message))

