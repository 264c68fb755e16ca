"""Ranking metrics for the re-rank task: parse `ID > ID > ...` chains and NDCG@k."""
from __future__ import annotations

import math
import re

_CHAIN = re.compile(r"\[?(\d+)\]?(?:\s*>\s*\[?(\d+)\]?)+")


def parse_ranking(text: str | None) -> list[int]:
    """The longest `>`-chain of integers in `text` (HELMET's parser), de-duplicated in order.
    A text without a chain falls back to every bracketed `[n]` id in order; none -> []."""
    if not text:
        return []
    best: list[int] = []
    for m in _CHAIN.finditer(text):
        ids = [int(x) for x in re.findall(r"\d+", m.group(0))]
        if len(ids) > len(best):
            best = ids
    if not best:
        best = [int(x) for x in re.findall(r"\[(\d+)\]", text)]
    return list(dict.fromkeys(best))  # first occurrences, in order


def ndcg_at_k(ranking: list[int], qrels: dict[int, int], k: int = 10) -> float:
    """NDCG@k with gains 2^rel - 1 and log2 discounts (trec_eval's ndcg_cut convention is
    linear gain; we follow the common exponential form: equal when grades are 0/1)."""
    ideal = sorted((r for r in qrels.values() if r > 0), reverse=True)[:k]
    if not ideal:
        return 0.0
    idcg = sum((2**r - 1) / math.log2(i + 2) for i, r in enumerate(ideal))
    dcg = sum((2 ** qrels.get(doc, 0) - 1) / math.log2(i + 2) for i, doc in enumerate(ranking[:k]))
    return dcg / idcg
