"""OpenAI-MRCR's grade: the response must start with the asked prefix, then
`difflib.SequenceMatcher(None, response_minus_prefix, gold_minus_prefix).ratio()`."""
from __future__ import annotations

from difflib import SequenceMatcher

_QUOTES = ("```", "\"", "'", "`")


def strip_wrapping(text: str) -> str:
    """`text` without surrounding whitespace and a pair (or fence) of quotes/backticks around it."""
    text = text.strip()
    for q in _QUOTES:
        if len(text) >= 2 * len(q) and text.startswith(q) and text.endswith(q):
            return text[len(q):-len(q)].strip()
    return text


def similarity(response: str | None, gold: str, prefix: str) -> float:
    """The SequenceMatcher ratio of the (stripped) response without the prefix against the gold answer
    without it, with no prefix check: a diagnostic of whether the model copied the right answer at all."""
    if not response:
        return 0.0
    text = strip_wrapping(response).removeprefix(prefix).strip()
    return SequenceMatcher(None, text, gold.removeprefix(prefix).strip()).ratio()


def prefixed_similarity(response: str | None, gold: str, prefix: str) -> float:
    """OpenAI-MRCR's grade: 0 when the (stripped) response does not start with `prefix`, else
    `similarity` (what follows the prefix against the gold answer's own remainder, both stripped)."""
    if not response or not prefix or not strip_wrapping(response).startswith(prefix):
        return 0.0
    return similarity(response, gold, prefix)
