"""String metrics: SQuAD-style normalisation, exact match, substring exact match (HELMET
SubEM), token F1 and RULER's recall of references (case-insensitive substring)."""
from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lowercase, drop punctuation and English articles, squash whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(output: str | None, golds: list[str]) -> float:
    """1.0 when the normalised output equals any normalised gold."""
    if not output:
        return 0.0
    out = normalize_answer(output)
    return float(any(out == normalize_answer(g) for g in golds))


def substring_exact_match(output: str | None, golds: list[str]) -> float:
    """1.0 when any normalised gold occurs inside the normalised output (HELMET SubEM)."""
    if not output:
        return 0.0
    out = normalize_answer(output)
    return float(any(normalize_answer(g) and normalize_answer(g) in out for g in golds))


def ruler_recall(output: str | None, golds: list[str]) -> float:
    """Fraction of golds found in the output, case-insensitive substring (RULER string_match_all)."""
    if not output or not golds:
        return 0.0
    out = output.lower()
    return sum(g.lower() in out for g in golds) / len(golds)


def token_f1(output: str | None, golds: list[str]) -> float:
    """Max over golds of the bag-of-tokens F1 of the normalised strings."""
    if not output:
        return 0.0
    pred = normalize_answer(output).split()
    best = 0.0
    for g in golds:
        ref = normalize_answer(g).split()
        common = Counter(pred) & Counter(ref)
        same = sum(common.values())
        if same == 0:
            continue
        p, r = same / len(pred), same / len(ref)
        best = max(best, 2 * p * r / (p + r))
    return best
