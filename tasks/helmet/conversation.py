"""Multi-turn conversations as prompts, and their length fitting.

A conversation is a list of (role, content) turns ending with a user turn. Chat mode sends it as chat
messages; completion mode renders it as a transcript ("User: ...", "Assistant: ..." paragraphs) that
ends with "Assistant:", which the model continues.

`fit_turns` is `tasks.fitting.fit_pieces` for conversations: each turn's content comes as pieces
split where the tokenizer splits anyway, each piece counted once per tokenizer (`piece_tokens`,
memoised: a sentence reused across turns, samples and lengths is counted once); the template's cost is
linear in the number of turns (fixed part and per-turn part measured on two small exact counts), so the
search adds counts instead of rendering. The chosen conversation is counted exactly and refitted with a
shifted aim while it misses the target (the same aim, acceptance band and at most 4 exact counts as
`fit_pieces`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tasks.base import BuildSpec, PromptMode, TaskError, TokenCounter, continue_chat_text
from tasks.fitting import piece_tokens, search

Pieces = tuple[str, ...]  # a turn's content, split where the tokenizer's pre-tokenizer splits anyway
Turn = tuple[str, Pieces]  # (role: "user" | "assistant", content = "".join(pieces))
_LABELS = {"user": "User", "assistant": "Assistant", "system": "System"}
ANSWER_PREFIX = "Assistant:"  # what a completion-mode transcript ends with


def render_turns(turns: Sequence[Turn], mode: PromptMode) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(prompt, messages): the transcript ending with "Assistant:", or the chat messages."""
    if mode == "chat":
        return None, [{"role": r, "content": "".join(c)} for r, c in turns]
    return "".join(f"{_LABELS[r]}: {''.join(c)}\n\n" for r, c in turns) + ANSWER_PREFIX, None


def count_turns(turns: Sequence[Turn], mode: PromptMode, tok: TokenCounter) -> int:
    """Prompt tokens under the reference tokenizer, chat template included (as `count_tokens`)."""
    prompt, messages = render_turns(turns, mode)
    if prompt is not None:
        return len(tok.encode(prompt, add_special_tokens=True))
    assert messages is not None
    return len(tok.encode(continue_chat_text(messages, tok)))


@dataclass
class TurnFit:
    turns: list[Turn]
    n: int  # filler units chosen by the search
    tail: int  # tokens of the tail (0 = none)
    prompt_tokens: int


def fit_turns(
    make: Callable[[int, int], list[Turn]],
    spec: BuildSpec,
    budget: int,
    task: str,
    n_min: int = 1,
    n_guess: int = 16,
    tail_max: int = 0,
) -> TurnFit:
    """Largest n (then tail <= tail_max) whose conversation `make(n, tail)` fits
    `target - budget`; `make` must be monotone in n and deterministic. Raises TaskError naming the
    minimum length when even `n_min` does not fit."""
    limit = spec.target_length - budget
    tok = spec.tokenizer

    def exact(n: int, tail: int) -> tuple[list[Turn], int]:
        turns = make(n, tail)
        return turns, count_turns(turns, spec.mode, tok)

    def content(turns: list[Turn]) -> int:
        return sum(piece_tokens([p for _, c in turns for p in c], tok))

    first, first_tokens = exact(n_min, 0)
    if first_tokens > limit:
        raise TaskError(
            f"target length {spec.target_length} is too small for task {task} "
            f"(needs > {first_tokens + budget} tokens); pick a longer length")
    probe, probe_tokens = exact(n_min + 4, 0)
    per_turn = 0.0
    if len(probe) > len(first):
        per_turn = ((probe_tokens - content(probe)) - (first_tokens - content(first))) / (len(probe) - len(first))
    fixed = first_tokens - content(first) - per_turn * len(first)
    seen: dict[tuple[int, int], int] = {}

    def est(n: int, tail: int = 0) -> int:
        if (n, tail) not in seen:
            turns = make(n, tail)
            seen[n, tail] = round(fixed + content(turns) + per_turn * len(turns))
        return seen[n, tail]

    found = search(est, exact, limit, n_min, n_guess, tail_max, task, spec.target_length)
    if found is None or found[3] <= first_tokens:
        return TurnFit(first, n_min, 0, first_tokens)
    return TurnFit(*found)
