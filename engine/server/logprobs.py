"""Engine log-prob rows (`engine.scoring.LogprobRow`: the token's log p and its top alternatives by id)
-> OpenAI's two logprobs shapes: the legacy completions object and chat's `logprobs.content` list.
The numbers are the engine's (one computation, `engine.scoring`); this module only names tokens."""
from __future__ import annotations

from typing import Any

from engine.server.schemas import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob

Row = tuple[Any, dict]


def _text(tok: Any, token: int | str) -> str:
    return tok.decode([token], skip_special_tokens=False) if isinstance(token, int) else str(token)


def completion_logprobs(tok: Any, ids: list[int], rows: list[Row]) -> CompletionLogprobs:
    """The legacy object for `ids` and their rows (a prompt's first row is (None, {}): no context)."""
    if len(rows) != len(ids):
        raise ValueError(f"{len(rows)} log-prob rows for {len(ids)} tokens")
    tokens = [_text(tok, t) for t in ids]
    offsets, pos = [], 0
    for s in tokens:
        offsets.append(pos)
        pos += len(s)
    tops: list[dict[str, float] | None] = [
        None if lp is None else {_text(tok, k): float(v) for k, v in (top or {}).items()} for lp, top in rows]
    return CompletionLogprobs(tokens=tokens, token_logprobs=[None if lp is None else float(lp) for lp, _ in rows],
                              top_logprobs=tops, text_offset=offsets)


def _top(tok: Any, token: int | str, logprob: float) -> TopLogprob:
    s = _text(tok, token)
    return TopLogprob(token=s, logprob=float(logprob), bytes=list(s.encode("utf-8", errors="replace")))


def chat_logprobs(tok: Any, ids: list[int], rows: list[Row]) -> ChatLogprobs:
    """Chat's `{"content": [{token, logprob, bytes, top_logprobs: [...]}]}` for generated `ids` and their rows
    (`bytes`: the UTF-8 of the decoded token; a token holding part of a character decodes to U+FFFD)."""
    if len(rows) != len(ids):
        raise ValueError(f"{len(rows)} log-prob rows for {len(ids)} tokens")
    content = []
    for t, (lp, top) in zip(ids, rows, strict=True):
        alternatives = [_top(tok, k, v) for k, v in (top or {}).items()]
        content.append(TokenLogprob(**_top(tok, t, lp).model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)
