"""The `openai` backend: any OpenAI-compatible endpoint (hosted APIs, vLLM, SGLang, `msa-eval serve`).

Built on the official `openai` client (`AsyncOpenAI`, its own retries off). What it adds:
  * API key from the environment variable named by `api_key_env`, read when the client is
    made; it is never stored in the config, `describe()`, results or the cache, and its value
    is scrubbed from every error message (`redact.py`: endpoints may echo it in error bodies).
    Local base URLs (127.0.0.1, localhost) work without one.
  * At most `max_concurrency` requests in flight; retries with exponential backoff and
    jitter on 429, 5xx, timeouts and connection errors (`retry.py`). Each attempt is bounded
    end to end by `attempt_timeout_s`: `timeout_s` + `timeout_per_1k_tokens_s` per 1,000 tokens
    of prompt + max_tokens (defaults 120 s + 5 s: 1K tokens 125 s, 128K 760 s, 1M 5.4 ks), so a
    long prompt gets the time its prefill needs and a short one fails fast. Prompt tokens: the
    token counter when there is one, else UTF-8 bytes / 3 (an upper estimate for BPE
    vocabularies: about 4 bytes per English token, 3 per CJK character).
  * Streaming (default) to measure time to first token (here, at the client); usage from the
    final stream chunk; decode tokens/s follow from ttft_s and latency_s (report/latency.py).
  * The server's own split when it sends one (`msa-eval serve`: the `msa_eval_timings` field,
    engine.server.timings): queue_s, prefill_s, decode_s in the GenResult; its TTFT in
    extra["server_ttft_s"] (ttft_s is the client's when streaming, else the server's).
  * Cost from the price table (`pricing.py`): unknown model -> cost None.
  * A response cache keyed by the request hash (`cache.py`) in `cache_dir` (the run
    directory): reruns replay finished requests, so they are reproducible and resumable.
  * A context guard: with `context_window` and a token counter, a prompt that cannot fit
    (prompt + max_tokens > window) is refused before sending; a provider's own
    context-length 400 is mapped to `ContextLimitError` and never retried.
Error channels: `generate` returns a GenResult with finish_reason "error" for a request that
failed (retries exhausted, context limit) and keeps the others; a wrong configuration
(missing key, 401/403, unknown model/404) raises `EndpointConfigError` at once. `chat`
raises `BackendError` subclasses for every failure.
The sync methods run the async ones on a private event-loop thread, so they also work
when the caller is itself inside an event loop.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import openai

from msa_eval.backends.base import BackendError, ChatResponse, GenRequest, GenResult, ToolCall
from msa_eval.backends.cache import ResponseCache, request_key
from msa_eval.backends.openai_calls import call_once
from msa_eval.backends.pricing import PriceTable
from msa_eval.backends.redact import redact
from msa_eval.backends.retry import RetryPolicy, with_retries


class EndpointConfigError(BackendError):
    """Missing API key, rejected key, or a model the endpoint does not know."""


class ContextLimitError(BackendError):
    """The prompt (plus max_tokens) does not fit the provider's context window."""


_CONTEXT_HINTS = ("context length", "context_length", "maximum context", "context window", "too many tokens")


@dataclass(frozen=True)
class OpenAIBackendConfig:
    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 8
    max_retries: int = 6
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    timeout_s: float = 120.0  # each attempt: this + timeout_per_1k_tokens_s per 1K tokens (attempt_timeout_s)
    timeout_per_1k_tokens_s: float = 5.0
    stream: bool = True
    context_window: int | None = None
    max_tokens_field: str = "max_tokens"  # or "max_completion_tokens" (newer OpenAI models, MiniMax)
    chat_only: bool = False  # send text prompts as one user message (providers without /completions)
    cache_dir: str | None = None
    prices_path: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_concurrency", "max_retries", "backoff_initial_s", "backoff_max_s", "timeout_s",
                     "timeout_per_1k_tokens_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if urlparse(self.base_url).scheme not in ("http", "https"):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        for name in ("timeout_s", "timeout_per_1k_tokens_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.max_concurrency < 1 or self.max_retries < 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0 and timeout_s > 0 are required")
        if self.max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ValueError("max_tokens_field must be 'max_tokens' or 'max_completion_tokens'")


def _is_local(base_url: str) -> bool:
    return (urlparse(base_url).hostname or "") in ("127.0.0.1", "localhost", "::1")


class OpenAIBackend:
    name = "openai"

    def __init__(self, config: OpenAIBackendConfig, token_counter: Callable[[str], int] | None = None) -> None:
        self.cfg = config
        self._count = token_counter
        self._prices = PriceTable.load(config.prices_path)
        self._cache = ResponseCache(config.cache_dir) if config.cache_dir else None
        self._policy = RetryPolicy(config.max_retries, config.backoff_initial_s, config.backoff_max_s)
        self._client: openai.AsyncOpenAI | None = None
        self._key: str | None = None  # the key's value, only to scrub it from error text
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.retries = 0  # retried attempts so far (for the run record)

    # ---------------------------------------------------------------- plumbing
    def _api_key(self) -> str:
        key = os.environ.get(self.cfg.api_key_env)
        if key:
            return key
        if _is_local(self.cfg.base_url):
            return "EMPTY"
        raise EndpointConfigError(f"no API key: set the environment variable {self.cfg.api_key_env} for "
                                  f"{self.cfg.base_url} (or name another variable with api_key_env)")

    def _ensure(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        """The client and the concurrency gate, made together on first use."""
        if self._client is None or self._sem is None:
            self._key = self._api_key()
            self._client = openai.AsyncOpenAI(api_key=self._key, base_url=self.cfg.base_url,
                                              max_retries=0, timeout=self.cfg.timeout_s)
            self._sem = asyncio.Semaphore(self.cfg.max_concurrency)
        return self._client, self._sem

    def _run(self, coro: Any) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="openai-backend", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop is not None:
            if self._client is not None:
                self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None
        self._client = None

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"backend": "openai", "base_url": c.base_url, "model": c.model, "api_key_env": c.api_key_env,
                "stream": c.stream, "max_concurrency": c.max_concurrency, "max_retries": c.max_retries,
                "timeout_s": c.timeout_s, "timeout_per_1k_tokens_s": c.timeout_per_1k_tokens_s,
                "context_window": c.context_window, "chat_only": c.chat_only, "response_cache": c.cache_dir is not None}

    def count_tokens(self, text: str) -> int | None:
        return self._count(text) if self._count is not None else None

    # ---------------------------------------------------------------- one call
    def attempt_timeout_s(self, prompt_tokens: int, max_tokens: int) -> float:
        """Seconds one attempt may take: timeout_s + timeout_per_1k_tokens_s x (prompt + max_tokens) / 1000."""
        return self.cfg.timeout_s + self.cfg.timeout_per_1k_tokens_s * (prompt_tokens + max_tokens) / 1000

    def _prompt_tokens(self, text: str) -> int:
        """The counter's count, else the upper estimate UTF-8 bytes / 3 (module docstring)."""
        n = self.count_tokens(text)
        return n if n is not None else -(-len(text.encode("utf-8", "surrogatepass")) // 3)

    def _guard(self, text: str, max_tokens: int) -> float:
        """Refuse a prompt that cannot fit the context window; return the attempt timeout for it."""
        window = self.cfg.context_window
        n = self.count_tokens(text) if self._count is not None else None
        if window and n is not None and n + max_tokens > window:
            raise ContextLimitError(f"prompt of {n} tokens + max_tokens {max_tokens} exceeds the context window "
                                    f"{window} of {self.cfg.model}; shorten the prompt or lower max_tokens")
        if n is None:
            n = self._prompt_tokens(text)
        return self.attempt_timeout_s(n, max_tokens)

    async def _call(self, endpoint: str, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        key = request_key(self.cfg.base_url, endpoint, payload)
        if self._cache is not None and (hit := self._cache.get(key)) is not None:
            return {**hit, "cached": True}
        client, sem = self._ensure()

        def on_retry(attempt: int, e: BaseException) -> None:
            self.retries += 1

        async def attempt() -> dict[str, Any]:
            try:
                return await asyncio.wait_for(call_once(client, endpoint, payload, self.cfg.stream, timeout_s),
                                              timeout_s)
            except asyncio.TimeoutError:
                raise TimeoutError(f"no answer within {timeout_s:.1f} s (timeout_s {self.cfg.timeout_s:g} + "
                                   f"timeout_per_1k_tokens_s {self.cfg.timeout_per_1k_tokens_s:g} per 1K tokens of "
                                   f"prompt + max_tokens)") from None

        async with sem:
            try:
                out = await with_retries(attempt, self._policy, on_retry)
            except Exception as e:  # noqa: BLE001 - any failure becomes one redacted BackendError, not chained
                raise self._backend_error(e) from None
        out["cost_usd"] = self._prices.cost(self.cfg.model, out["prompt_tokens"], out["completion_tokens"])
        if self._cache is not None:
            self._cache.put(key, out)
        return {**out, "cached": False}

    def _backend_error(self, e: Exception) -> BackendError:
        """The one place a provider failure becomes a BackendError; its message is redacted."""
        msg = redact(_message(e), self._key, self.cfg.api_key_env)
        if isinstance(e, (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)):
            return EndpointConfigError(f"{self.cfg.base_url} refused the request ({e.status_code}): {msg}; "
                                       f"check the key in {self.cfg.api_key_env} and the model id {self.cfg.model!r}")
        if isinstance(e, openai.BadRequestError):
            if any(h in msg.lower() for h in _CONTEXT_HINTS):
                return ContextLimitError(f"{self.cfg.model}: {msg}")
            return BackendError(f"{self.cfg.base_url} rejected the request (400): {msg}")
        return BackendError(f"{self.cfg.base_url} failed after {self.cfg.max_retries} retries: "
                            f"{type(e).__name__}: {msg}")

    def _sampling(self, max_tokens: int, temperature: float, top_p: float | None = None,
                  stop: list[str] | None = None, seed: int | None = None) -> dict[str, Any]:
        p: dict[str, Any] = {"model": self.cfg.model, self.cfg.max_tokens_field: max_tokens, "temperature": temperature}
        if top_p is not None and top_p != 1.0:
            p["top_p"] = top_p
        if stop:
            p["stop"] = list(stop)
        if seed is not None:
            p["seed"] = seed
        return p

    # ---------------------------------------------------------------- Backend interface
    async def agenerate(self, requests: list[GenRequest]) -> list[GenResult]:
        return list(await asyncio.gather(*(self._generate_one(r) for r in requests)))

    async def _generate_one(self, r: GenRequest) -> GenResult:
        if (r.prompt is None) == (r.messages is None):
            raise BackendError(f"request {r.id}: give exactly one of prompt or messages")
        sampling = self._sampling(r.max_tokens, r.temperature, r.top_p, r.stop, r.seed)
        if r.prompt is not None and not self.cfg.chat_only:
            endpoint, payload, text = "completions", {**sampling, "prompt": r.prompt}, r.prompt
        else:
            messages = r.messages if r.messages is not None else [{"role": "user", "content": r.prompt}]
            endpoint, payload = "chat", {**sampling, "messages": messages}
            text = "\n".join(str(m.get("content") or "") for m in messages)
        try:
            timeout_s = self._guard(text, r.max_tokens)
            out = await self._call(endpoint, payload, timeout_s)
        except EndpointConfigError:
            raise
        except BackendError as e:
            return GenResult(id=r.id, text="", finish_reason="error", error=f"{type(e).__name__}: {e}")
        server = out.get("server_timings") or {}  # cached results from before the field: none
        extra = {"cost_usd": out["cost_usd"], "cached": out["cached"], "endpoint": endpoint,
                 "system_fingerprint": out.get("system_fingerprint")}
        if "ttft_s" in server:
            extra["server_ttft_s"] = server["ttft_s"]
        if "attention_density" in server:
            extra["attention_density"] = server["attention_density"]
        return GenResult(id=r.id, text=out["text"], finish_reason=out["finish_reason"],
                         prompt_tokens=out["prompt_tokens"], completion_tokens=out["completion_tokens"],
                         latency_s=out["latency_s"], ttft_s=out["ttft_s"] if out["ttft_s"] is not None
                         else server.get("ttft_s"), queue_s=server.get("queue_s"),
                         prefill_s=server.get("prefill_s"), decode_s=server.get("decode_s"), extra=extra)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return self._run(self.agenerate(requests))

    async def achat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    max_tokens: int = 512, temperature: float = 0.0, seed: int | None = None) -> ChatResponse:
        payload = {**self._sampling(max_tokens, temperature, seed=seed), "messages": messages}
        if tools:
            payload["tools"] = tools
        timeout_s = self._guard("\n".join(str(m.get("content") or "") for m in messages), max_tokens)
        out = await self._call("chat", payload, timeout_s)
        return ChatResponse(content=out["text"] or None,
                            tool_calls=[ToolCall(c["id"], c["name"], c["arguments"]) for c in out["tool_calls"]],
                            finish_reason=out["finish_reason"], prompt_tokens=out["prompt_tokens"],
                            completion_tokens=out["completion_tokens"], latency_s=out["latency_s"],
                            cost_usd=out["cost_usd"], extra={"ttft_s": out["ttft_s"], "cached": out["cached"]})

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             max_tokens: int = 512, temperature: float = 0.0, seed: int | None = None) -> ChatResponse:
        return self._run(self.achat(messages, tools, max_tokens, temperature, seed))


def _message(e: BaseException) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(getattr(e, "message", None) or e)
