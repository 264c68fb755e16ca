"""Metrics of the offline suites: pure functions of (output text, gold) -> float in [0, 1]."""
from tasks.metrics.citation import citation_scores, parse_citations
from tasks.metrics.ranking import ndcg_at_k, parse_ranking
from tasks.metrics.rouge import rouge_l
from tasks.metrics.sets import parse_final_answer, set_f1
from tasks.metrics.similarity import prefixed_similarity, similarity, strip_wrapping
from tasks.metrics.text import (
    exact_match,
    normalize_answer,
    ruler_recall,
    substring_exact_match,
    token_f1,
)

__all__ = [
    "citation_scores", "exact_match", "ndcg_at_k", "normalize_answer", "parse_citations",
    "parse_final_answer", "parse_ranking", "prefixed_similarity", "rouge_l", "ruler_recall", "set_f1",
    "similarity", "strip_wrapping", "substring_exact_match", "token_f1",
]
