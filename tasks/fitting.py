"""Prompt rendering, length fitting and context-only truncation with the reference tokenizer.

Length policy (RULER/HELMET): a sample at target length T satisfies
    prompt_tokens(rendered prompt, template included) + generation budget <= T,
and the generators grow their context (number of items / sentences / passages) by binary
search until the next step would overflow; a task may add a partial "tail" unit to close
the remaining gap, so prompts land within ~1% of T. Only `PromptParts.context` is ever
truncated (from its end, HELMET policy), and the number of dropped tokens is recorded.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tasks.base import BuildSpec, PromptMode, PromptParts, TaskError, TokenCounter, continue_chat_text


def render(parts: PromptParts, mode: PromptMode) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(prompt, messages): completion text ending with the answer prefix, or chat messages
    (ending with an assistant prefill when `parts.chat_prefix == "assistant"`)."""
    body = parts.before + parts.context + parts.after
    if mode == "completion":
        prompt = body + (("\n" + parts.answer_prefix) if parts.answer_prefix else "")
        if parts.system:
            prompt = parts.system + "\n\n" + prompt
        return prompt, None
    user = body
    if parts.answer_prefix and parts.chat_prefix == "user":
        user += "\n" + parts.answer_prefix
    messages = ([{"role": "system", "content": parts.system}] if parts.system else [])
    messages.append({"role": "user", "content": user})
    if parts.answer_prefix and parts.chat_prefix == "assistant":
        messages.append({"role": "assistant", "content": parts.answer_prefix})
    return None, messages


def count_tokens(parts: PromptParts, mode: PromptMode, tok: TokenCounter) -> int:
    """Prompt tokens under the reference tokenizer, chat template included."""
    prompt, messages = render(parts, mode)
    if prompt is not None:
        return len(tok.encode(prompt, add_special_tokens=True))
    assert messages is not None  # render gives a prompt or messages
    return len(tok.encode(continue_chat_text(messages, tok)))


def cut_to_tokens(text: str, n_tokens: int, tok: TokenCounter) -> str:
    """The longest prefix of `text` of at most `n_tokens` tokens (decoded back to text)."""
    if n_tokens <= 0:
        return ""
    ids = tok.encode(text)
    return text if len(ids) <= n_tokens else tok.decode(ids[:n_tokens])


@dataclass
class Fit:
    parts: PromptParts
    n: int  # units chosen by the search
    tail: int  # tokens of the partial tail unit (0 = none)
    prompt_tokens: int


def fit_parts(
    make: Callable[[int, int], PromptParts],
    spec: BuildSpec,
    budget: int,
    task: str,
    n_min: int = 1,
    n_guess: int = 16,
    tail_max: int = 0,
) -> Fit:
    """Largest n (then largest tail <= tail_max) with prompt + budget <= target.

    `make(n, tail)` must be monotone in n (more units, more tokens) and deterministic.
    Raises TaskError when even `n_min` units do not fit.
    """
    limit = spec.target_length - budget

    def size(n: int, tail: int = 0) -> int:
        return count_tokens(make(n, tail), spec.mode, spec.tokenizer)

    if size(n_min) > limit:
        raise TaskError(
            f"target length {spec.target_length} is too small for task {task} "
            f"(needs > {size(n_min) + budget} tokens); pick a longer length"
        )
    lo, hi = n_min, max(n_guess, n_min + 1)
    while size(hi) <= limit:  # exponential search for an overflowing n
        if hi > 1 << 20:
            raise TaskError(f"task {task} cannot grow to {spec.target_length} tokens")
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # invariant: size(lo) fits, size(hi) overflows
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= limit else (lo, mid)
    best_tail, tokens = 0, size(lo)
    gap = limit - tokens
    if tail_max and gap > 2:
        t_lo, t_hi = 0, min(tail_max, gap) + 1
        while t_hi - t_lo > 1:
            mid = (t_lo + t_hi) // 2
            t_lo, t_hi = (mid, t_hi) if size(lo, mid) <= limit else (t_lo, mid)
        best_tail = t_lo
    parts = make(lo, best_tail)
    return Fit(parts, lo, best_tail, count_tokens(parts, spec.mode, spec.tokenizer))


def truncate_context(
    parts: PromptParts, mode: PromptMode, tok: TokenCounter, max_prompt_tokens: int,
    marker: str = "\n[... the rest of the text is omitted ...]\n",
) -> tuple[PromptParts, int]:
    """Drop tokens from the END of the context until the prompt fits; returns (parts, dropped
    context tokens). Raises TaskError when the prompt does not fit even with no context."""
    total = count_tokens(parts, mode, tok)
    if total <= max_prompt_tokens:
        return parts, 0
    ctx_ids = tok.encode(parts.context)
    if count_tokens(replace(parts, context=marker), mode, tok) > max_prompt_tokens:
        raise TaskError(
            f"prompt template alone exceeds {max_prompt_tokens} tokens; use a longer length"
        )
    keep = max(0, len(ctx_ids) - (total - max_prompt_tokens) - len(tok.encode(marker)))
    while True:
        new = replace(parts, context=tok.decode(ctx_ids[:keep]) + marker)
        if count_tokens(new, mode, tok) <= max_prompt_tokens or keep == 0:
            return new, len(ctx_ids) - keep
        keep = max(0, keep - 8)
