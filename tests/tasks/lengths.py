"""The length check every generator test shares: the prompt's exact count under the tokenizer (chat: the
template with the assistant prefill) equals the recorded one, and prompt + budget lies within 1% of the
target, never over it."""
from __future__ import annotations

from tasks.base import continue_chat_text


def exact_tokens(sample, tok) -> int:
    if sample.messages is not None:
        return len(tok.encode(continue_chat_text(sample.messages, tok)))
    return len(tok.encode(sample.prompt, add_special_tokens=True))


def check(sample, length: int, tok) -> None:
    real = exact_tokens(sample, tok)
    assert real == sample.metadata["prompt_tokens"]
    total = real + sample.max_tokens
    assert 0.99 * length <= total <= length, (sample.id, total)
