"""Prompt rendering, length fitting and context-only truncation with the reference tokenizer.

Length policy (RULER/HELMET): a sample at target length T satisfies
    prompt_tokens(rendered prompt, template included) + generation budget <= T,
and the generators grow their context (number of items / sentences / passages) by binary
search until the next step would overflow; a task may add a partial "tail" unit to close
the remaining gap, so prompts land within ~1% of T. Only `PromptParts.context` is ever
truncated (from its end, HELMET policy), and the number of dropped tokens is recorded.

`fit_parts` counts the whole prompt at every step of its search: exact, and quick up to a few
thousand tokens. `fit_pieces` is the long-context form (32K-1M): the context comes as pieces split
where the tokenizer's pre-tokenizer splits anyway (before a space or a newline that follows a
non-space), each piece counted once per tokenizer (`piece_tokens`, memoised), so the search adds
counts instead of re-tokenizing growing strings; the chosen prompt is then counted exactly once, and
the search is repeated with a shifted aim when the sum and the exact count disagree (a tokenizer
that merges across a piece boundary).
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
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


_PIECE_COUNTS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
_MAX_MEMO = 1 << 21  # pieces remembered per tokenizer before the memo starts over


def piece_tokens(pieces: Sequence[str], tok: TokenCounter) -> list[int]:
    """Token count of each piece, counted alone (no special tokens); memoised per tokenizer, and
    counted in one `encode_batch` call where the tokenizer has one (the engine's: parallel)."""
    try:
        memo = _PIECE_COUNTS.setdefault(tok, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: count without a memo
        memo = {}
    missing = list(dict.fromkeys(p for p in pieces if p not in memo))
    if missing:
        if len(memo) + len(missing) > _MAX_MEMO:
            memo.clear()
        batch = getattr(tok, "encode_batch", None)
        ids = batch(missing) if callable(batch) else [tok.encode(p) for p in missing]
        memo.update(zip(missing, map(len, ids), strict=True))
    return [memo[p] for p in pieces]


def forget_piece_counts() -> None:
    """Drop every memoised piece count (the next fit counts its pieces afresh: a cold start)."""
    _PIECE_COUNTS.clear()


Pieces = tuple[PromptParts, Sequence[str]]  # the prompt's parts (context unused) and the context's pieces


def fit_pieces(
    make: Callable[[int, int], Pieces],
    spec: BuildSpec,
    budget: int,
    task: str,
    n_min: int = 1,
    n_guess: int = 16,
    tail_max: int = 0,
) -> Fit:
    """`fit_parts` for long contexts: largest n (then tail <= tail_max) whose estimated prompt
    (template tokens + the sum of the pieces' counts) fits `target - budget - margin`; the result is
    counted exactly and refitted (at most 4 exact counts) while that count overflows or falls short
    of the target by more than 0.5%. `make(n, tail)` returns
    (parts, pieces) with context = "".join(pieces); it must be monotone in n and deterministic."""
    limit = spec.target_length - budget
    templates: dict[tuple[Any, ...], int] = {}
    seen: dict[tuple[int, int], int] = {}

    def est(n: int, tail: int = 0) -> int:
        if (n, tail) not in seen:
            seen[n, tail] = _estimate(n, tail)
        return seen[n, tail]

    def _estimate(n: int, tail: int) -> int:
        parts, pieces = make(n, tail)
        key = (parts.before, parts.after, parts.answer_prefix, parts.system, parts.chat_prefix)
        if key not in templates:
            templates[key] = count_tokens(replace(parts, context=""), spec.mode, spec.tokenizer)
        return templates[key] + sum(piece_tokens(pieces, spec.tokenizer))

    def exact(n: int, tail: int) -> tuple[PromptParts, int]:
        parts, pieces = make(n, tail)
        parts = replace(parts, context="".join(pieces))
        return parts, count_tokens(parts, spec.mode, spec.tokenizer)

    if est(n_min) > limit:
        parts, tokens = exact(n_min, 0)
        if tokens > limit:
            raise TaskError(
                f"target length {spec.target_length} is too small for task {task} "
                f"(needs > {tokens + budget} tokens); pick a longer length")
    best = search(est, exact, limit, n_min, n_guess, tail_max, task, spec.target_length)
    if best is not None:
        parts, n, tail, tokens = best
        return Fit(parts, n, tail, tokens)
    raise TaskError(f"task {task} could not be fitted to {spec.target_length} tokens with this tokenizer; "
                    "report it with the tokenizer's name")


def search(est: Callable[..., int], exact: Callable[[int, int], tuple[Any, int]], limit: int, n_min: int,
           n_guess: int, tail_max: int, task: str, target: int) -> tuple[Any, int, int, int] | None:
    """The fit loop of every fitter: the largest (n, tail <= tail_max) whose exact count (`exact(n, tail)` ->
    (prompt, tokens)) is at most `limit`, aimed a margin below it and accepted within 0.5% (well within 1%);
    `est(n, tail)`, the cheap estimate, is monotone in n. Up to 4 tries: when the pieces do not add up exactly
    with this tokenizer (e.g. it merges across a newline) the aim shifts by the difference seen and the fit
    runs again. Returns (prompt, n, tail, tokens) of the largest fit seen, or None when none fitted."""
    margin = 4 + limit // 1000
    want = limit - margin  # the exact count aimed at; accepted down to `low`
    low = limit - max(2 * margin, limit // 200)
    aim, best = want, None  # aim: in estimated tokens
    for _ in range(4):
        n = _largest(est, aim, n_min, n_guess, task, target)
        tail = 0
        if tail_max:
            tail = max(0, min(tail_max, aim - est(n)))
            while tail > 0 and est(n, tail) > aim:
                tail = max(0, tail - max(1, est(n, tail) - aim))
        prompt, tokens = exact(n, tail)
        if tokens <= limit and (best is None or tokens > best[3]):
            best = (prompt, n, tail, tokens)
        if best is not None and low <= tokens <= limit:
            return best
        aim = want + (est(n, tail) - tokens)
    return best


def _largest(est: Callable[[int], int], aim: int, lo: int, guess: int, task: str, target: int) -> int:
    """The largest n >= lo with est(n) <= aim (est monotone in n), or lo when none fits. The
    estimate is close to linear in n, so secant steps land next to the answer and a short
    galloping search finishes it: about ten calls of `make` at any length."""
    e_lo = est(lo)
    if e_lo > aim:
        return lo
    n0, e0 = lo, e_lo
    n1 = max(guess, lo + 1)
    e1 = est(n1)
    for _ in range(6):  # secant steps towards est(n) = aim
        if e1 == e0:
            break
        n2 = max(lo, n1 + int((aim - e1) * (n1 - n0) / (e1 - e0)))
        if n2 > 1 << 24:
            raise TaskError(f"task {task} cannot grow to {target} tokens")
        if n2 == n1:
            break
        n0, e0, n1, e1 = n1, e1, n2, est(n2)
    if e1 <= aim:  # gallop up from a fitting n ...
        good, step = n1, 1
        while est(good + step) <= aim:
            if good + step > 1 << 24:
                raise TaskError(f"task {task} cannot grow to {target} tokens")
            good, step = good + step, step * 2
        bad = good + step
    else:  # ... or down from an overflowing one
        bad, step = n1, 1
        while bad - step > lo and est(bad - step) > aim:
            bad, step = bad - step, step * 2
        good = max(lo, bad - step)
    while bad - good > 1:  # invariant: est(good) <= aim < est(bad)
        mid = (good + bad) // 2
        good, bad = (mid, bad) if est(mid) <= aim else (good, mid)
    return good
