"""`msa-eval report` on a real agent batch run (oracle backend, `smoke` suite, run through the
CLI), alone and beside a real HELMET run directory."""
import csv
import json

import pytest

from msa_eval.report.agents import build_agent_report, is_agent_run, load_agent_runs

pytestmark = pytest.mark.timeout(2400)  # the mixed test shares the session's real-model needle run


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    import os
    import subprocess

    from tests.msa_eval.conftest import msa_eval_cmd

    d = tmp_path_factory.mktemp("agent_run")
    p = subprocess.run(msa_eval_cmd("run", "agents", "--suite", "smoke", "--backend", "oracle",
                                    "--sandbox", "local", "--out", str(d / "run")),
                       cwd=d, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr[-3000:]
    return d / "run"


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]


def test_agent_report_cli_tables_match_the_records(agent_run, run_cli, tmp_path):
    recs = _records(agent_run)
    assert is_agent_run(agent_run) and {r["family"] for r in recs} == {"regression", "needle", "rename", "ledger"}
    out = tmp_path / "rep"
    p = run_cli("report", str(agent_run), "--out", str(out), "--markdown")
    assert p.returncode == 0, p.stderr
    assert "| oracle |" in p.stdout and "| overall |" in p.stdout
    rows = list(csv.DictReader((out / "agents.csv").open()))
    assert [r["family"] for r in rows] == ["regression", "needle", "rename", "ledger", "overall"]
    overall = json.loads((out / "agents.json").read_text())["rows"][-1]
    assert overall["tasks"] == len(recs) == 4
    assert overall["success_rate"] == pytest.approx(sum(r["score"] for r in recs) / 4, abs=1e-3)
    assert overall["mean_steps"] == pytest.approx(sum(r["steps"] for r in recs) / 4, abs=0.01)
    assert overall["max_peak_context_tokens"] == max(r["peak_context_tokens"] for r in recs)
    assert overall["total_tokens"] == sum(r["prompt_tokens"] + r["completion_tokens"] for r in recs)
    assert overall["cost_usd"] == 0.0  # the oracle costs nothing: known, not None
    statuses = {}
    for r in recs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    assert overall["statuses"] == statuses
    c_row = next(r for r in rows if r["family"] == "rename")
    c_rec = next(r for r in recs if r["family"] == "rename")
    assert int(c_row["total_tokens"]) == c_rec["prompt_tokens"] + c_rec["completion_tokens"]
    assert not (out / "report.md").exists()  # no HELMET run, no HELMET table


def test_agent_rows_per_backend_and_unknown_hosted_cost(agent_run):
    """A relabelled openai copy gets its own rows; its zero summed cost means 'not reported'."""
    recs = load_agent_runs([agent_run])
    hosted = [{**r, "backend": "openai:m", "_model": "m", "cost_usd": 0.0} for r in recs]
    rep = build_agent_report(recs + hosted)
    keys = [(r["backend"], r["family"]) for r in rep.rows]
    assert keys.count(("oracle", "overall")) == keys.count(("openai:m", "overall")) == 1
    assert all(r["cost_usd"] is None for r in rep.rows if r["backend"] == "openai:m")
    assert all(r["model"] == "m" for r in rep.rows if r["backend"] == "openai:m")
    again = load_agent_runs([agent_run, agent_run])  # same folder twice: no renamed duplicate column
    assert {r["backend"] for r in again} == {"oracle"}


def test_records_with_letters_are_reported_by_name(agent_run):
    """Records written before the families had names (family "A".."D") join the named rows."""
    recs = load_agent_runs([agent_run])
    letters = {"regression": "A", "needle": "B", "rename": "C", "ledger": "D"}
    old = [{**r, "family": letters[r["family"]]} for r in recs]
    assert build_agent_report(old).rows == build_agent_report(recs).rows
    mixed = build_agent_report(recs + [{**recs[0], "family": letters[recs[0]["family"]]}])
    assert [r["tasks"] for r in mixed.rows if r["family"] == recs[0]["family"]] == [2]


def test_mixed_helmet_and_agent_report(needle_run, agent_run, run_cli, tmp_path):
    out = tmp_path / "rep"
    p = run_cli("report", str(needle_run["run_dir"]), str(agent_run), "--out", str(out), "--json", "--no-plots")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["helmet"]["columns"] == ["local:dense@2k"]
    assert data["agents"]["rows"][-1]["family"] == "overall"
    assert json.loads((out / "report.json").read_text())["columns"] == ["local:dense@2k"]
    assert json.loads((out / "agents.json").read_text()) == data["agents"]
