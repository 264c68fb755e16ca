"""Latency and cost in the report: per backend x task x length, over the samples that answered (status ok).

  ttft_s         mean time to first token: measured by the client when it streamed (openai backend), else
                 the engine's or server's own
  decode_tok_s   mean over samples of (completion tokens - 1) / decode time; decode time = the server's or
                 engine's decode_s when it reported one, else latency_s - ttft_s (the client's view)
  queue_s, prefill_s, decode_s
                 means of the server's or engine's split, where the backend reported one (`msa-eval serve`'s
                 msa_eval_timings; the local backend has no queue)
  tokens_in, tokens_out
                 mean prompt and completion tokens, as the backend counted them
  cost_usd       total of the cell from the price table; None when any sample's price is unknown
Empty (None) where no sample of the cell has the value.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from msa_eval.runner.records import SampleRecord

FIELDS = ("backend", "task", "length", "samples", "ttft_s", "decode_tok_s", "queue_s", "prefill_s", "decode_s",
          "tokens_in", "tokens_out", "cost_usd")


def _mean(xs: list[float], digits: int = 3) -> float | None:
    return round(sum(xs) / len(xs), digits) if xs else None


def decode_tok_s(r: SampleRecord) -> float | None:
    """Decode speed of one sample (module docstring), None when it cannot be told."""
    n = (r.completion_tokens or 0) - 1
    t = r.decode_s if r.decode_s is not None else (
        r.latency_s - r.ttft_s if r.latency_s is not None and r.ttft_s is not None else None)
    return n / t if n > 0 and t is not None and t > 0 else None


def latency_rows(records: list[SampleRecord]) -> list[dict[str, Any]]:
    """One row per backend x task x length with at least one answered sample (fields: FIELDS)."""
    cells: dict[tuple[str, str, int], list[SampleRecord]] = defaultdict(list)
    for r in records:
        if r.status == "ok":
            cells[(r.backend, r.task, r.length)].append(r)
    rows = []
    for (b, t, n), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        costs = [r.cost_usd for r in rs]

        def mean_of(name: str, rs: list[SampleRecord] = rs, digits: int = 3) -> float | None:
            return _mean([v for v in (getattr(r, name) for r in rs) if v is not None], digits)

        rows.append({
            "backend": b, "task": t, "length": n, "samples": len(rs),
            "ttft_s": mean_of("ttft_s"),
            "decode_tok_s": _mean([v for v in map(decode_tok_s, rs) if v is not None], 2),
            "queue_s": mean_of("queue_s", digits=4), "prefill_s": mean_of("prefill_s"),
            "decode_s": mean_of("decode_s"),
            "tokens_in": mean_of("prompt_tokens", digits=1), "tokens_out": mean_of("completion_tokens", digits=1),
            "cost_usd": round(sum(c for c in costs if c is not None), 6) if all(c is not None for c in costs)
            else None,
        })
    return rows


def latency_markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The latency and cost table as Markdown lines, or nothing without rows."""
    if not rows:
        return []
    out = ["", "## Latency and cost per backend x task x length", "",
           ("Means over answered samples. ttft_s: the client's when it streamed, else the engine's/server's; "
            "decode_tok_s: tokens after the first / decode time (the server's decode_s when reported, else "
            "latency - ttft); queue_s / prefill_s / decode_s: the engine's own split (msa-eval serve, the local "
            "backend); tokens_in / tokens_out: per sample; cost_usd: the cell's total from the price "
            "table (empty: a price is unknown)."), "",
           "| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    for r in rows:
        out.append("| " + " | ".join("" if r[f] is None else str(r[f]) for f in FIELDS) + " |")
    return out
