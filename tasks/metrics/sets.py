"""Set metrics for GraphWalks-style answers: parse the node list of the last `Final Answer:` line,
F1 of the predicted set against the gold set."""
from __future__ import annotations

import re

_FINAL = re.compile(r"final answer\s*:", re.IGNORECASE)
_STRIP = " \t\r\n'\"`*.[]"


def parse_final_answer(text: str | None) -> list[str] | None:
    """The items of the last `Final Answer: [a, b, ...]` line (brackets optional, items stripped of
    whitespace, quotes and markdown, lower-cased, de-duplicated in order); None when no such line."""
    if not text:
        return None
    found = None
    for line in text.splitlines():
        ms = list(_FINAL.finditer(line))
        if ms:
            found = line[ms[-1].end():]
    if found is None:
        return None
    body = found.strip().strip("*` ")
    m = re.match(r"\[(.*?)\]", body)
    items = (m.group(1) if m else body).split(",")
    return list(dict.fromkeys(x for x in (i.strip(_STRIP).lower() for i in items) if x))


def set_f1(pred: list[str] | None, gold: list[str]) -> tuple[float, float, float]:
    """(f1, precision, recall) of the predicted items as a set against the gold set; an empty or
    missing prediction scores 0 (the gold set is never empty)."""
    p, g = set(pred or ()), {x.lower() for x in gold}
    hit = len(p & g)
    if not hit:
        return 0.0, 0.0, 0.0
    precision, recall = hit / len(p), hit / len(g)
    return 2 * precision * recall / (precision + recall), precision, recall
