"""One OpenAI-compatible call (chat or legacy completions), streaming or not, normalised to a dict.

The dict is what the response cache stores: text, tool_calls, finish_reason, prompt_tokens,
completion_tokens (None when the provider sends no usage), ttft_s (streaming only: time to
the first content or tool-call delta, measured here), latency_s (this attempt), system_fingerprint,
server_timings (the server's own split when it sends one: `msa-eval serve`'s `msa_eval_timings`
extension field, `engine.server.timings`; None from other servers).
`timeout_s` bounds the HTTP exchange of this attempt (the client's per-request timeout).
"""
from __future__ import annotations

import time
from typing import Any

from openai import AsyncOpenAI

from engine.server.timings import TIMINGS_FIELD


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    return getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)


def _server_timings(obj: Any) -> dict[str, float] | None:
    """The extension field from a response or chunk (the openai client keeps unknown fields in model_extra)."""
    value = (getattr(obj, "model_extra", None) or {}).get(TIMINGS_FIELD)
    if not isinstance(value, dict):
        return None
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _message_tool_calls(message: Any) -> list[dict[str, str]]:
    calls = getattr(message, "tool_calls", None) or []
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls]


async def call_once(client: AsyncOpenAI, endpoint: str, payload: dict[str, Any], stream: bool,
                    timeout_s: float | None = None) -> dict[str, Any]:
    """Send one request (no retries here); return the normalised result."""
    start = time.perf_counter()
    opts: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
    if not stream:
        if endpoint == "chat":
            r = await client.chat.completions.create(**payload, **opts)
            choice = r.choices[0]
            text, calls = choice.message.content or "", _message_tool_calls(choice.message)
        else:
            r = await client.completions.create(**payload, **opts)
            choice = r.choices[0]
            text, calls = choice.text or "", []
        p, c = _usage(r.usage)
        return {"text": text, "tool_calls": calls, "finish_reason": choice.finish_reason or "stop",
                "prompt_tokens": p, "completion_tokens": c, "ttft_s": None,
                "latency_s": time.perf_counter() - start, "system_fingerprint": getattr(r, "system_fingerprint", None),
                "server_timings": _server_timings(r)}
    create = client.chat.completions.create if endpoint == "chat" else client.completions.create
    events = await create(**payload, stream=True, stream_options={"include_usage": True}, **opts)
    pieces: list[str] = []
    slots: dict[int, dict[str, str]] = {}  # streamed tool calls by index
    finish, usage, ttft, fingerprint, timings = None, None, None, None, None
    try:  # close the HTTP stream also when cancelled (timeout) or failing mid-way
        async for chunk in events:
            fingerprint = getattr(chunk, "system_fingerprint", None) or fingerprint
            timings = _server_timings(chunk) or timings
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
            for choice in chunk.choices or []:
                if endpoint == "chat":
                    delta = choice.delta
                    piece = (delta.content or "") if delta is not None else ""
                    for tc in (getattr(delta, "tool_calls", None) or []) if delta is not None else []:
                        slot = slots.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["arguments"] += tc.function.arguments or ""
                        if ttft is None:
                            ttft = time.perf_counter() - start
                else:
                    piece = choice.text or ""
                if piece:
                    pieces.append(piece)
                    if ttft is None:
                        ttft = time.perf_counter() - start
                finish = choice.finish_reason or finish
    finally:
        await events.close()
    p, c = _usage(usage)
    return {"text": "".join(pieces), "tool_calls": [slots[i] for i in sorted(slots)], "finish_reason": finish or "stop",
            "prompt_tokens": p, "completion_tokens": c, "ttft_s": ttft, "latency_s": time.perf_counter() - start,
            "system_fingerprint": fingerprint, "server_timings": timings}
