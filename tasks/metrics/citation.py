"""Rule-based citation precision and recall (an offline stand-in for ALCE's NLI judge).

A statement is one sentence of the output. Its *claims* are the gold answers it mentions.
- citation recall: fraction of statements with at least one claim whose claims all occur
  in the union of the documents they cite (statements without claims count as unsupported,
  as ALCE would find no entailing citation for them).
- citation precision: fraction of citations that support their statement alone (the cited
  document contains at least one of the statement's claims).
Matching is normalised substring matching (`normalize_answer`).
"""
from __future__ import annotations

import re

from tasks.metrics.text import normalize_answer

_CITE = re.compile(r"\[(\d+)\]")
_SENT = re.compile(r"(?<=[.!?\n])\s+")


def parse_citations(statement: str) -> list[int]:
    return [int(x) for x in _CITE.findall(statement)]


def citation_scores(output: str | None, golds: list[str], docs: dict[int, str]) -> dict[str, float]:
    """Returns answer_recall, citation_recall, citation_precision (all 0 for empty output).
    `docs` maps the citation number shown in the prompt to the document text."""
    zero = {"answer_recall": 0.0, "citation_recall": 0.0, "citation_precision": 0.0}
    if not output or not output.strip():
        return zero
    norm_docs = {k: normalize_answer(v) for k, v in docs.items()}
    norm_golds = [normalize_answer(g) for g in golds]
    statements = [s for s in _SENT.split(output.strip()) if s.strip()]
    supported, n_cites, good_cites = 0, 0, 0
    mentioned: set[str] = set()
    for st in statements:
        claims = [g for g in norm_golds if g and g in normalize_answer(_CITE.sub(" ", st))]
        mentioned.update(claims)
        cites = parse_citations(st)
        n_cites += len(cites)
        cited_text = " ".join(norm_docs.get(c, "") for c in cites)
        if claims and cites and all(c in cited_text for c in claims):
            supported += 1
        good_cites += sum(
            1 for c in cites if claims and any(cl in norm_docs.get(c, "") for cl in claims)
        )
    return {
        "answer_recall": len(mentioned) / len(norm_golds) if norm_golds else 0.0,
        "citation_recall": supported / len(statements),
        "citation_precision": good_cites / n_cites if n_cites else 0.0,
    }
