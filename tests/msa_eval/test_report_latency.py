"""The latency and cost table of `msa-eval report` (msa_eval/report/latency.py) from constructed records."""
from __future__ import annotations

import csv

import pytest

from msa_eval.report import build_report
from msa_eval.report.latency import FIELDS, decode_tok_s, latency_rows
from msa_eval.report.writers import to_markdown, write_report
from msa_eval.runner.records import SampleRecord


def _rec(backend: str, i: int, **kw) -> SampleRecord:
    base = dict(backend=backend, sample_id=f"niah_single/2048/{i:04d}", task="niah_single", category="recall",
                length=2048, mode="chat", status="ok", prompt_hash=f"h{i}", prompt_tokens_ref=2000, answers=["7"],
                output="7", parsed="7", score=1.0, metric="substring_exact_match", extraction_failed=False)
    return SampleRecord(**{**base, **kw})


def test_rows_per_backend_task_length_with_the_split_only_where_reported():
    records = [
        # our server: the split, client TTFT; 11 tokens after 0.5 s of decode -> 20 tok/s
        _rec("openai:smollm2-135m", 0, prompt_tokens=2000, completion_tokens=11, latency_s=2.0, ttft_s=1.5,
             queue_s=0.25, prefill_s=1.0, decode_s=0.5, cost_usd=0.0),
        _rec("openai:smollm2-135m", 1, prompt_tokens=2100, completion_tokens=21, latency_s=3.0, ttft_s=2.0,
             queue_s=0.75, prefill_s=1.0, decode_s=1.0, cost_usd=0.0),
        # a hosted API: no split, decode from latency - ttft (9 tokens / 0.3 s = 30 tok/s), priced
        _rec("openai:MiniMax-M2", 0, prompt_tokens=1900, completion_tokens=10, latency_s=1.3, ttft_s=1.0,
             cost_usd=0.0006),
        _rec("openai:MiniMax-M2", 1, prompt_tokens=1900, completion_tokens=10, latency_s=1.3, ttft_s=1.0,
             cost_usd=None),  # unknown price: the cell's cost is unknown
        _rec("openai:MiniMax-M2", 2, status="error", output=None, score=0.0),  # not answered: not counted
    ]
    rows = {r["backend"]: r for r in latency_rows(records)}
    ours, hosted = rows["openai:smollm2-135m"], rows["openai:MiniMax-M2"]
    assert ours == {"backend": "openai:smollm2-135m", "task": "niah_single", "length": 2048, "samples": 2,
                    "ttft_s": 1.75, "decode_tok_s": 20.0, "queue_s": 0.5, "prefill_s": 1.0, "decode_s": 0.75,
                    "tokens_in": 2050.0, "tokens_out": 16.0, "cost_usd": 0.0}
    assert hosted["samples"] == 2 and hosted["decode_tok_s"] == pytest.approx(30.0)
    assert hosted["queue_s"] is hosted["prefill_s"] is hosted["decode_s"] is hosted["cost_usd"] is None
    assert decode_tok_s(_rec("b", 9, completion_tokens=1, latency_s=1.0, ttft_s=0.5)) is None  # one token: no decode


def test_markdown_csv_and_json_carry_the_table(tmp_path):
    records = [_rec("openai:m", i, prompt_tokens=100, completion_tokens=5, latency_s=1.0, ttft_s=0.5,
                    cost_usd=0.001) for i in range(3)]
    rep = build_report(records, n_boot=10)
    md = to_markdown(rep)
    assert "## Latency and cost per backend x task x length" in md and "| " + " | ".join(FIELDS) + " |" in md
    paths = write_report(rep, tmp_path)
    [row] = list(csv.DictReader(paths["latency_csv"].open()))
    assert row["backend"] == "openai:m" and float(row["cost_usd"]) == pytest.approx(0.003)
    assert rep.to_dict()["latency"][0]["decode_tok_s"] == 8.0
