"""Build the side-by-side report: rows = tasks grouped by category, plus category means and
the overall score (mean of category means, HELMET's "Ours"); columns = backend @ length;
paired Δ (MSA - dense) with stratified bootstrap CIs and, per task, the exact McNemar / sign test
p-value; efficiency and failure rates; the selection telemetry of local MSA arms (`report.telemetry`)."""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from msa_eval.report.latency import latency_rows
from msa_eval.report.stats import median, sign_test
from msa_eval.report.telemetry import telemetry_layers, telemetry_rows
from msa_eval.runner.records import SampleRecord

CATEGORY_ORDER = ("recall", "rag", "rerank", "cite", "longqa", "summ", "icl", "coref", "graph")
ALL_SUITE = "helmet_all"  # configs/helmet_all.yaml: a task of every category at CPU-friendly sizes
OVERALL = "overall"


@dataclass
class Report:
    columns: list[tuple[str, int]]  # (backend, length)
    rows: list[dict[str, Any]]  # {kind: task|category|overall, category, name, cells{col: score|None}, n{col}}
    deltas: list[dict[str, Any]]  # {a, b, length, name, kind, delta, lo, hi, n, p, test}
    efficiency: list[dict[str, Any]]  # one per column
    notes: list[str] = field(default_factory=list)
    # optional judge (never in rows/deltas): {judge, task, column, mean (0-100), n, unparsed, errors}
    judge: list[dict[str, Any]] = field(default_factory=list)
    # selection telemetry of local MSA arms (msa_eval/report/telemetry.py): per arm x task x length, per layer
    telemetry: list[dict[str, Any]] = field(default_factory=list)
    telemetry_layers: list[dict[str, Any]] = field(default_factory=list)
    # latency and cost per backend x task x length (msa_eval/report/latency.py)
    latency: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def col(backend: str, length: int) -> str:
        return f"{backend}@{length // 1024}k" if length % 1024 == 0 else f"{backend}@{length}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["columns"] = [self.col(b, n) for b, n in self.columns]
        return d


def _cat_key(c: str) -> tuple[int, str]:
    return (CATEGORY_ORDER.index(c), c) if c in CATEGORY_ORDER else (len(CATEGORY_ORDER), c)


def _aggregate(task_means: dict[str, float], cat_of: dict[str, str]) -> dict[str, float]:
    """task means -> {task..., 'cat:<c>': category mean, 'overall': mean of category means}."""
    out = dict(task_means)
    by_cat: dict[str, list[float]] = defaultdict(list)
    for t, v in task_means.items():
        by_cat[cat_of[t]].append(v)
    for c, vs in by_cat.items():
        out[f"cat:{c}"] = sum(vs) / len(vs)
    cats = [out[f"cat:{c}"] for c in by_cat]
    if cats:
        out[OVERALL] = sum(cats) / len(cats)
    return out


def _pairs(backends: list[str], base: str = "dense") -> list[tuple[str, str]]:
    """(sparse, base) pairs of the same run family: `<kind>:msa*` against `<kind>:dense`; with base
    "msa-oracle", `<kind>:msa` against `<kind>:msa-oracle` (the indexer's cost; the gate pairs against dense)."""
    out = []
    for a in backends:
        head, _, tail = a.partition(":")
        arm, sep, suffix = tail.partition("#")
        if (arm.startswith("msa") if base == "dense" else arm == "msa") and f"{head}:{base}{sep}{suffix}" in backends:
            out.append((a, f"{head}:{base}{sep}{suffix}"))
    return out


def build_report(records: list[SampleRecord], n_boot: int = 1000, seed: int = 0) -> Report:
    backends = list(dict.fromkeys(r.backend for r in records))
    lengths = sorted({r.length for r in records})
    columns = [(b, n) for n in lengths for b in backends
               if any(r.backend == b and r.length == n for r in records)]
    cat_of = {r.task: r.category for r in records}
    tasks = sorted(cat_of, key=lambda t: (_cat_key(cat_of[t]), t))
    cell: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        cell[(r.backend, r.length)][r.task].append(r.score)
    agg = {c: _aggregate({t: sum(v) / len(v) for t, v in cell[c].items()}, cat_of) for c in columns}
    rows: list[dict[str, Any]] = []
    for cat in sorted({cat_of[t] for t in tasks}, key=_cat_key):
        for t in (t for t in tasks if cat_of[t] == cat):
            rows.append({"kind": "task", "category": cat, "name": t,
                         "cells": {Report.col(*c): _pct(agg[c].get(t)) for c in columns},
                         "n": {Report.col(*c): len(cell[c].get(t, [])) for c in columns}})
        rows.append({"kind": "category", "category": cat, "name": f"{cat} (mean)",
                     "cells": {Report.col(*c): _pct(agg[c].get(f"cat:{cat}")) for c in columns}, "n": {}})
    rows.append({"kind": "overall", "category": "", "name": "overall (mean of categories)",
                 "cells": {Report.col(*c): _pct(agg[c].get(OVERALL)) for c in columns}, "n": {}})
    deltas = []
    for a, b in _pairs(backends) + _pairs(backends, "msa-oracle"):
        for n in lengths:
            deltas += _paired_deltas(records, a, b, n, cat_of, n_boot, seed)
    notes = []
    if not _pairs(backends):
        notes.append("no MSA/dense pair among the backends: no deltas")
    notes += not_run_note({r.category for r in records})
    return Report(columns, rows, deltas, _efficiency(records, columns), notes, judge_rows(records, columns),
                  telemetry_rows(records), telemetry_layers(records), latency=latency_rows(records))


def not_run_note(categories: set[str]) -> list[str]:
    """One line naming the HELMET categories this run has no task of, and how to run them."""
    missing = [c for c in CATEGORY_ORDER if c not in categories]
    if not missing:
        return []
    line = (f"not run: {', '.join(missing)} (run every category: `msa-eval run {ALL_SUITE} --backend local`, "
            "or name tasks with --tasks; `msa-eval tasks list` shows each task's category)")
    return [line]


def judge_rows(records: list[SampleRecord], columns) -> list[dict[str, Any]]:
    """The optional judge's verdicts per (judge, task, column): mean normalised score x 100
    over parsed verdicts, with counts. Kept apart from the headline rows and deltas."""
    out = []
    judged = [(r, r.judge) for r in records if r.judge]
    for key in sorted({j["judge"] for _, j in judged}):
        mine = [(r, j) for r, j in judged if j["judge"] == key]
        for t in sorted({r.task for r, _ in mine}):
            for b, n in columns:
                js = [j for r, j in mine if r.task == t and r.backend == b and r.length == n]
                if not js:
                    continue
                vals = [j["normalized"] for j in js if j.get("normalized") is not None]
                out.append({"judge": key, "task": t, "column": Report.col(b, n),
                            "mean": _pct(sum(vals) / len(vals)) if vals else None, "n": len(vals),
                            "unparsed": sum(j.get("status") == "unparsed" for j in js),
                            "errors": sum(j.get("status") == "error" for j in js)})
    return out


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 1)


def _paired_deltas(records, a, b, length, cat_of, n_boot, seed) -> list[dict[str, Any]]:
    sa = {r.sample_id: r.score for r in records if r.backend == a and r.length == length}
    sb = {r.sample_id: r.score for r in records if r.backend == b and r.length == length}
    diffs: dict[str, list[float]] = defaultdict(list)
    pairs: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    task_of = {r.sample_id: r.task for r in records}
    for sid in sorted(set(sa) & set(sb)):
        diffs[task_of[sid]].append(sa[sid] - sb[sid])
        pairs[task_of[sid]][0].append(sa[sid])
        pairs[task_of[sid]][1].append(sb[sid])
    if not diffs:
        return []
    point = _aggregate({t: sum(d) / len(d) for t, d in diffs.items()}, cat_of)
    rng = random.Random(seed)
    boots: dict[str, list[float]] = defaultdict(list)
    for _ in range(n_boot):  # resample within each task (stratified), then aggregate
        tm = {t: sum(d[rng.randrange(len(d))] for _ in d) / len(d) for t, d in diffs.items()}
        for k, v in _aggregate(tm, cat_of).items():
            boots[k].append(v)
    out = []
    for k, v in point.items():
        bs = sorted(boots[k])
        kind = "overall" if k == OVERALL else ("category" if k.startswith("cat:") else "task")
        n = sum(len(diffs[t]) for t in diffs if k in (t, OVERALL) or f"cat:{cat_of[t]}" == k)
        test = sign_test(*pairs[k]) if kind == "task" else None  # aggregates: the bootstrap only
        out.append({"a": a, "b": b, "length": length, "name": k.removeprefix("cat:"), "kind": kind,
                    "delta": round(100 * v, 1), "lo": round(100 * bs[int(0.025 * len(bs))], 1),
                    "hi": round(100 * bs[min(len(bs) - 1, int(0.975 * len(bs)))], 1), "n": n,
                    "p": None if test is None else round(test.p, 4),
                    "test": None if test is None else test.test})
    return out


def _efficiency(records: list[SampleRecord], columns) -> list[dict[str, Any]]:
    out = []
    for b, n in columns:
        rs = [r for r in records if r.backend == b and r.length == n]
        k = len(rs)
        tok_s = [r.completion_tokens / r.decode_s for r in rs
                 if r.decode_s and r.completion_tokens and r.completion_tokens > 1]
        dens = [r.attention_density for r in rs if r.attention_density is not None]
        mem = [r.peak_mem_bytes for r in rs if r.peak_mem_bytes]
        pre = median([r.prefill_s * 1000 for r in rs if r.prefill_s is not None])
        lat = median([r.latency_s for r in rs if r.latency_s is not None])
        tok = median(tok_s)
        out.append({
            "column": Report.col(b, n), "backend": b, "length": n, "samples": k,
            "prefill_ms": round(pre, 1) if pre is not None else None,
            "decode_tok_s": round(tok, 2) if tok is not None else None,
            "latency_s": round(lat, 2) if lat is not None else None,
            "peak_mem_mb": round(max(mem) / 2**20, 1) if mem else None,
            "attention_density": round(sum(dens) / len(dens), 3) if dens else None,
            "null_rate": _rate(rs, lambda r: not (r.output or "").strip()),
            "error_rate": _rate(rs, lambda r: r.status == "error"),
            "truncation_rate": _rate(rs, lambda r: r.truncated_tokens > 0),
            "max_tokens_rate": _rate(rs, lambda r: r.finish_reason == "length"),
            "extraction_failure_rate": _rate(rs, lambda r: r.extraction_failed),
        })
    return out


def _rate(rs, pred) -> float | None:
    return round(sum(1 for r in rs if pred(r)) / len(rs), 3) if rs else None
