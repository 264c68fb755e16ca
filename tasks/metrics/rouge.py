"""ROUGE-L F1 through Google's `rouge-score` package (stemmed, as HELMET reports it)."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(output: str | None, references: list[str]) -> float:
    """Max over references of ROUGE-L F1; empty output -> 0."""
    if not output or not output.strip() or not references:
        return 0.0
    return max(_scorer().score(ref, output)["rougeL"].fmeasure for ref in references)
