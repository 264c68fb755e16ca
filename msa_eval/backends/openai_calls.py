"""One OpenAI-compatible call (chat or legacy completions), streaming or not, normalised to a dict.

The dict is what the response cache stores: text, tool_calls, finish_reason, prompt_tokens,
completion_tokens (None when the provider sends no usage), ttft_s (streaming only: time to
the first content or tool-call delta), latency_s (this attempt), system_fingerprint.
"""
from __future__ import annotations

import time
from typing import Any

from openai import AsyncOpenAI


def _usage(usage: Any) -> tuple[int | None, int | None]:
    if usage is None:
        return None, None
    return getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)


def _message_tool_calls(message: Any) -> list[dict[str, str]]:
    calls = getattr(message, "tool_calls", None) or []
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls]


async def call_once(client: AsyncOpenAI, endpoint: str, payload: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Send one request (no retries here); return the normalised result."""
    start = time.perf_counter()
    if not stream:
        if endpoint == "chat":
            r = await client.chat.completions.create(**payload)
            choice = r.choices[0]
            text, calls = choice.message.content or "", _message_tool_calls(choice.message)
        else:
            r = await client.completions.create(**payload)
            choice = r.choices[0]
            text, calls = choice.text or "", []
        p, c = _usage(r.usage)
        return {"text": text, "tool_calls": calls, "finish_reason": choice.finish_reason or "stop",
                "prompt_tokens": p, "completion_tokens": c, "ttft_s": None,
                "latency_s": time.perf_counter() - start, "system_fingerprint": getattr(r, "system_fingerprint", None)}
    create = client.chat.completions.create if endpoint == "chat" else client.completions.create
    events = await create(**payload, stream=True, stream_options={"include_usage": True})
    pieces: list[str] = []
    slots: dict[int, dict[str, str]] = {}  # streamed tool calls by index
    finish, usage, ttft, fingerprint = None, None, None, None
    try:  # close the HTTP stream also when cancelled (timeout) or failing mid-way
        async for chunk in events:
            fingerprint = getattr(chunk, "system_fingerprint", None) or fingerprint
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
            "system_fingerprint": fingerprint}
