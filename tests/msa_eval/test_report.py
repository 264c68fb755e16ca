"""Reports from real run directories: tables, files, plots; paired Δ on MSA/dense pairs."""
import csv
import json

import pytest

from msa_eval.report import build_report, load_runs
from msa_eval.report.build import _pairs
from msa_eval.report.stats import paired_bootstrap

# the session fixture runs the real model: generous on a loaded machine (~1 min when idle)
pytestmark = pytest.mark.timeout(2400)


def test_report_cli_writes_tables_and_plots(needle_run, run_cli, tmp_path):
    out = tmp_path / "rep"
    p = run_cli("report", str(needle_run["run_dir"]), "--out", str(out), "--markdown")
    assert p.returncode == 0, p.stderr
    assert "| recall | niah_single |" in p.stdout and "overall (mean of categories)" in p.stdout
    rows = list(csv.reader((out / "report.csv").open()))
    assert rows[0][:3] == ["category", "task", "local:dense@2k"]
    data = json.loads((out / "report.json").read_text())
    overall = [r for r in data["rows"] if r["kind"] == "overall"][0]
    task = [r for r in data["rows"] if r["name"] == "niah_single"][0]
    assert overall["cells"]["local:dense@2k"] == task["cells"]["local:dense@2k"]  # one task, one category
    eff = data["efficiency"][0]
    assert eff["samples"] == 3 and eff["prefill_ms"] > 0 and eff["null_rate"] == 0.0
    assert (out / "score_vs_length.png").stat().st_size > 1000
    assert (out / "depth_heatmap_local_dense.png").stat().st_size > 1000


def test_the_categories_not_run_are_named_under_the_table(needle_run, run_cli, tmp_path):
    """A recall-only run names every other category and how to run it; a run with all of them names none."""
    p = run_cli("report", str(needle_run["run_dir"]), "--out", str(tmp_path / "rep"), "--markdown")
    assert p.returncode == 0, p.stderr
    line = [x for x in p.stdout.splitlines() if "not run:" in x]
    assert len(line) == 1 and "not run: rag, rerank, cite, longqa, summ, icl, coref, graph " in line[0]
    assert "msa-eval run helmet_all --backend local" in line[0] and "--tasks" in line[0]
    dense = load_runs([needle_run["run_dir"]])
    others = ["rag", "rerank", "cite", "longqa", "summ", "icl", "coref"]
    every = dense + [r.model_copy(update={"category": c, "task": c}) for c in others for r in dense[:1]]
    want = ("not run: graph (run every category: `msa-eval run helmet_all --backend local`, or name tasks with "
            "--tasks; `msa-eval tasks list` shows each task's category)")
    assert [n for n in build_report(every, n_boot=10).notes if "not run" in n] == [want]
    every.append(dense[0].model_copy(update={"category": "graph", "task": "graphwalks"}))
    assert not [n for n in build_report(every, n_boot=10).notes if "not run" in n]


def test_paired_deltas_on_real_records(needle_run):
    """Pair the real dense records with a copy relabelled as MSA: equal scores give Δ = 0
    with a zero-width CI; zeroing the copy gives Δ = -mean(dense)."""
    dense = load_runs([needle_run["run_dir"]])
    same = [r.model_copy(update={"backend": "local:msa"}) for r in dense]
    rep = build_report(dense + same, n_boot=200)
    overall = [d for d in rep.deltas if d["kind"] == "overall"][0]
    assert (overall["delta"], overall["lo"], overall["hi"]) == (0.0, 0.0, 0.0)
    zero = [r.model_copy(update={"score": 0.0}) for r in same]
    rep = build_report(dense + zero, n_boot=200)
    mean = 100 * sum(r.score for r in dense) / len(dense)
    overall = [d for d in rep.deltas if d["kind"] == "overall"][0]
    assert overall["delta"] == pytest.approx(-mean, abs=0.1) and overall["lo"] <= overall["delta"] <= overall["hi"]


def test_paired_bootstrap_and_pairing_rules():
    d, lo, hi = paired_bootstrap([1, 1, 0, 1], [0, 1, 0, 0], n_boot=500)
    assert d == 0.5 and 0.0 <= lo <= d <= hi <= 1.0
    with pytest.raises(ValueError):
        paired_bootstrap([1], [1, 0])
    assert _pairs(["local:msa", "local:dense", "openai:x"]) == [("local:msa", "local:dense")]
    assert _pairs(["local:msa-ref#b", "local:dense#b", "local:dense"]) == [("local:msa-ref#b", "local:dense#b")]
    three = ["local:dense", "local:msa", "local:msa-oracle", "local:msa#r", "local:msa-oracle#r", "local:msa-ref"]
    assert _pairs(three, "msa-oracle") == [("local:msa", "local:msa-oracle"), ("local:msa#r", "local:msa-oracle#r")]
