"""Retries with exponential backoff and jitter for OpenAI-compatible calls.

Retried: 429, 408, 409, 5xx, timeouts and connection errors. Not retried: every other 4xx
(bad request, authentication, unknown model, context too long): repeating cannot help.
The wait before attempt n+1 is d/2 + uniform(0, d/2) with d = min(max_s, initial_s * 2**n),
or the server's Retry-After when that is longer (capped at max_s).
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import openai

T = TypeVar("T")
_RETRY_STATUS = {408, 409, 429}


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 6
    initial_s: float = 1.0
    max_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        d = min(self.max_s, self.initial_s * 2 ** attempt)
        d = d / 2 + random.uniform(0, d / 2)
        if retry_after is not None:
            d = max(d, min(retry_after, self.max_s))
        return d


def is_retryable(e: BaseException) -> bool:
    if isinstance(e, (openai.APITimeoutError, openai.APIConnectionError, asyncio.TimeoutError, TimeoutError)):
        return True
    if isinstance(e, openai.APIStatusError):
        return e.status_code in _RETRY_STATUS or e.status_code >= 500
    return False


def retry_after_s(e: BaseException) -> float | None:
    response = getattr(e, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def with_retries(call: Callable[[], Awaitable[T]], policy: RetryPolicy,
                       on_retry: Callable[[int, BaseException], None] | None = None) -> T:
    """Await `call()`; on a retryable error wait and try again, up to `policy.max_retries` times."""
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as e:
            if not is_retryable(e) or attempt >= policy.max_retries:
                raise
            if on_retry is not None:
                on_retry(attempt, e)
            await asyncio.sleep(policy.delay(attempt, retry_after_s(e)))
            attempt += 1
