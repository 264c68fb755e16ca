"""Token accounting for agent contexts.

The backend's own tokenizer is used when it has one (`Backend.count_tokens`); otherwise the
stated approximation is ceil(characters / 4), a rough average for English and code under BPE
tokenizers (SmolLM2's tokenizer gives ~3.3-4.2 chars/token on Python source).
Provider-reported prompt tokens, when present, always win for usage and peak context.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

TokenFn = Callable[[str], int]


def approx_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def messages_text(messages: list[dict[str, Any]]) -> str:
    """A flat rendering of chat messages (roles, contents, tool calls) used for counting."""
    parts = []
    for m in messages:
        parts.append(f"<{m.get('role')}>")
        if m.get("content"):
            parts.append(str(m["content"]))
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", {})
            parts.append(f"{fn.get('name')}({fn.get('arguments')})")
    return "\n".join(parts)


def counter_for(backend: Any) -> tuple[TokenFn, str]:
    """(count function, name of the method) for a backend: its tokenizer, else the approximation."""
    fn = getattr(backend, "count_tokens", None)
    if fn is not None:
        try:
            if fn("probe text") is not None:
                return (lambda t: int(fn(t))), "backend-tokenizer"
        except Exception:  # noqa: BLE001 - an unusable tokenizer falls back to the stated approximation
            pass
    return approx_tokens, "approx-chars/4"


def tools_text(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


class MessageCounter:
    """Tokens of a message list = sum of per-message counts, cached by message text, so a long
    trajectory is tokenized once (not once per step). Differs from counting the joined text only
    at message boundaries (a token or two per message)."""

    def __init__(self, count: TokenFn):
        self._count = count
        self._cache: dict[bytes, int] = {}

    def __call__(self, messages: list[dict[str, Any]]) -> int:
        import hashlib

        total = 0
        for m in messages:
            text = messages_text([m])
            key = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest()
            n = self._cache.get(key)
            if n is None:
                n = self._cache[key] = self._count(text)
            total += n
        return total
