"""Selection telemetry in the report (msa_eval/report/telemetry.py) from constructed records, the runner's
`--telemetry/--no-telemetry` switch, and the score-vs-length plot drawn per task."""
from __future__ import annotations

import csv
import json

import pytest

from msa_eval.report import build_report
from msa_eval.report.telemetry import FIELDS, recall_by_layer_depth
from msa_eval.runner.records import SampleRecord

LAYERS = [2, 3, 4]


def _telemetry(recall: float) -> dict:
    """A record's `msa_telemetry` as engine/msa/telemetry.py writes it: 3 MSA layers x 2 KV groups."""
    per = {m: [[v, v] for v in (recall, recall / 2, 1.0)] for m in
           ("recall", "mass_recall", "mass", "keys_read", "local_share")}
    per["far_recall"] = [[recall, None], None, [1.0, 1.0]]  # None: the oracle kept no far block there
    per["layer_overlap"] = [[0.5, 0.5], [0.25, 0.25], None]
    per["decode_overlap"] = [[1.0, 1.0]] * 3
    cells = {m: [v for row in rows if row for v in row if v is not None] for m, rows in per.items()}
    mean = {m: sum(v) / len(v) for m, v in cells.items()}
    return {"version": 2, "probe_queries": 64, "prefill_probes": 64, "decode_tokens": 3, "decode": "eager",
            "layers": LAYERS, **per, "mean": mean}


def _rec(backend: str, task: str, length: int, i: int, score: float, depth: float | None = None,
         recall: float | None = None) -> SampleRecord:
    return SampleRecord(backend=backend, sample_id=f"{task}/{length}/{i}", task=task, category="recall",
                        length=length, mode="completion", status="ok", prompt_hash="h", prompt_tokens_ref=length,
                        depth=depth, answers=["x"], output="x", parsed="x", score=score, metric="em",
                        extraction_failed=False,
                        msa_telemetry=None if recall is None else _telemetry(recall))


def _records() -> list[SampleRecord]:
    out = []
    for i in range(4):
        depth = i / 4
        for b, rec in (("local:msa", 0.4 + 0.1 * i), ("local:msa-oracle", 1.0), ("local:dense", None)):
            out.append(_rec(b, "niah_single", 2048, i, 1.0, depth, rec))
            out.append(_rec(b, "niah_single", 4096, i, float(i % 2), depth, rec))
            out.append(_rec(b, "json_kv", 2048, i, 0.0, None, rec))  # json_kv only at 2K
    return out


def test_telemetry_table_per_arm_task_length_and_per_layer(tmp_path):
    from msa_eval.report.writers import to_markdown, write_report

    recs = _records()
    rep = build_report(recs, n_boot=50)
    rows = {(t["backend"], t["task"], t["length"]): t for t in rep.telemetry}
    assert set(rows) == {(b, t, n) for b in ("local:msa", "local:msa-oracle")
                         for t, n in (("niah_single", 2048), ("niah_single", 4096), ("json_kv", 2048))}
    msa = rows[("local:msa", "niah_single", 2048)]
    # per sample: mean of (r, r/2, 1) over layers; over samples r = 0.4..0.7
    assert msa["recall"] == pytest.approx((0.55 * 1.5 + 1) / 3, abs=1e-4) and msa["samples"] == 4
    assert msa["layer_overlap"] == pytest.approx(0.375) and msa["decode_overlap"] == 1.0
    assert msa["far_recall"] == pytest.approx((0.55 + 2) / 3, abs=1e-4)
    assert rows[("local:msa-oracle", "json_kv", 2048)]["recall"] == pytest.approx((1 + 0.5 + 1) / 3, abs=1e-4)
    assert all(0 <= t[m] <= 1 for t in rep.telemetry for m in FIELDS[3:-1])
    layers = [x for x in rep.telemetry_layers if x["backend"] == "local:msa" and x["length"] == 2048
              and x["task"] == "niah_single"][0]
    assert layers["layers"] == LAYERS and layers["recall"] == pytest.approx([0.55, 0.275, 1.0])
    assert layers["layer_overlap"] == [0.5, 0.25, None]
    md = to_markdown(rep)
    assert "## Selection telemetry (local MSA arms)" in md and "| local:msa | niah_single | 2048 |" in md
    paths = write_report(rep, tmp_path)
    with open(paths["telemetry_csv"]) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 and list(table[0]) == list(FIELDS)
    data = json.loads(paths["json"].read_text())
    assert len(data["telemetry"]) == 6 and data["telemetry_layers"][0]["layers"] == LAYERS
    assert not build_report([r for r in recs if r.backend == "local:dense"], n_boot=10).telemetry  # dense: none
    old = _rec("local:msa", "niah_single", 2048, 9, 1.0, 0.5, 0.5)  # a version-1 record: no far_recall
    old.msa_telemetry.pop("far_recall"), old.msa_telemetry["mean"].pop("far_recall")
    [row] = build_report([old], n_boot=10).telemetry
    assert row["far_recall"] is None and row["recall"] == pytest.approx((0.5 + 0.25 + 1) / 3, abs=1e-4)


def test_recall_by_layer_x_depth_plot_and_score_vs_length_per_task(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from msa_eval.report.plots import _score_vs_length, plot_report

    recs = _records()
    layers, grid = recall_by_layer_depth(recs, "local:msa", 2048)
    assert layers == LAYERS and len(grid) == 10
    assert grid[0][0] == pytest.approx(0.4) and grid[7][0] == pytest.approx(0.7) and grid[1][0] is None
    rep = build_report(recs, n_boot=10)
    paths = plot_report(rep, recs, tmp_path)
    for name in ("telemetry_recall_local_msa.png", "telemetry_recall_local_msa-oracle.png", "score_vs_length.png"):
        assert (tmp_path / name) in paths and (tmp_path / name).stat().st_size > 1000
    assert not (tmp_path / "telemetry_recall_local_dense.png").exists()
    lines = _score_vs_length(plt, rep, tmp_path / "again.png")
    # one line per task x arm: json_kv (2K only) is never averaged into niah_single's 4K point
    assert lines["niah_single (local:dense)"] == ((2048, 4096), (100.0, 50.0))
    assert lines["json_kv (local:dense)"] == ((2048,), (0.0,))
    assert len(lines) == 6


def test_run_switch_turns_telemetry_on_for_local_msa_arms_only(tmp_path):
    from msa_eval.cli.run_setup import RunArgs, prepare
    from msa_eval.runner.run import to_record

    def prep(**kw):
        return prepare(RunArgs("helmet", "local", None, "dense,msa,msa-oracle", None, None, "2k", 1, "niah_single",
                               None, None, None, None, tmp_path / kw.pop("out"), **kw))

    on, off = prep(out="on"), prep(out="off", telemetry=False)
    assert [b.options.get("msa_telemetry") for b in on.cfg.backends] == [None, True, True]
    assert all("msa_telemetry" not in b.options for b in off.cfg.backends)
    assert on.cfg.config_hash() == off.cfg.config_hash()  # it measures the selection, not the answers
    tp = prep(out="tp", engine_opts={"tensor_parallel_size": 2})
    assert all("msa_telemetry" not in b.options for b in tp.cfg.backends)  # telemetry runs in one process
    from msa_eval.backends.base import GenResult

    s = on.plan[0].samples[0]
    tel = _telemetry(0.5)
    rec = to_record("local:msa", s, GenResult(s.id, "x", extra={"attention_density": 0.3, "msa_telemetry": tel}))
    assert rec.msa_telemetry == tel
    assert SampleRecord.model_validate_json(rec.model_dump_json()).msa_telemetry == tel
