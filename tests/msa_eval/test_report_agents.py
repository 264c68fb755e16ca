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


def test_cost_and_context_per_task_and_per_turn(agent_run, run_cli, tmp_path):
    """The per-task and per-turn tables equal the trajectories' step lines and the records' totals."""
    out = tmp_path / "rep"
    p = run_cli("report", str(agent_run), "--out", str(out))
    assert p.returncode == 0, p.stderr
    recs = {r["task_id"]: r for r in _records(agent_run)}
    tasks = {r["task_id"]: r for r in csv.DictReader((out / "agents_tasks.csv").open())}
    turns = list(csv.DictReader((out / "agents_turns.csv").open()))
    assert set(tasks) == set(recs)
    for tid, rec in recs.items():
        steps = [json.loads(line) for line in (agent_run / "trajectories" / f"{tid}.jsonl").read_text().splitlines()
                 if line.strip() and json.loads(line)["type"] == "step"]
        mine = [t for t in turns if t["task_id"] == tid]
        assert [int(t["prompt_tokens"]) for t in mine] == [s["usage"]["prompt_tokens"] for s in steps]
        assert int(mine[-1]["cumulative_tokens"]) == rec["prompt_tokens"] + rec["completion_tokens"]
        assert [int(t["context_growth"]) for t in mine[1:]] == [
            b["usage"]["prompt_tokens"] - a["usage"]["prompt_tokens"] for a, b in zip(steps, steps[1:], strict=False)]
        t = tasks[tid]
        assert (int(t["steps"]), int(t["peak_context_tokens"]), float(t["cost_usd"])) == (
            rec["steps"], rec["peak_context_tokens"], 0.0)
    assert (out / "agents_context.png").stat().st_size > 0
    js = json.loads((out / "agents.json").read_text())
    assert [(t["task_id"], t["step"], t["cumulative_tokens"]) for t in js["turns"]] == [
        (t["task_id"], int(t["step"]), int(t["cumulative_tokens"])) for t in turns]


def test_turns_of_hosted_and_old_trajectories(agent_run, tmp_path):
    """A hosted backend's step without a price is unknown (not 0) from that turn on; a trajectory from before the
    per-call usage field still reads (its context count stands in); a record whose trajectory is gone is noted."""
    recs = load_agent_runs([agent_run])
    rec = next(r for r in recs if r["family"] == "regression")
    lines = [json.loads(line) for line in (agent_run / "trajectories" / f"{rec['task_id']}.jsonl").read_text()
             .splitlines() if line.strip()]
    priced = [dict(x, usage={**x["usage"], "cost_usd": 0.001 if x["step"] == 1 else None}) if x["type"] == "step"
              else x for x in lines]
    old = [{k: v for k, v in x.items() if k != "usage"} for x in lines]
    for name, body in (("priced", priced), ("old", old)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in body))
    hosted = {**rec, "backend": "openai:m", "_run_dir": None, "trajectory": str(tmp_path / "priced.jsonl")}
    older = {**rec, "backend": "old", "_run_dir": None, "trajectory": str(tmp_path / "old.jsonl")}
    gone = {**rec, "backend": "gone", "_run_dir": None, "trajectory": str(tmp_path / "missing.jsonl")}
    rep = build_agent_report([hosted, older, gone])
    h = [t for t in rep.turns if t["backend"] == "openai:m"]
    assert (h[0]["cost_usd"], h[0]["cumulative_cost_usd"]) == (0.001, 0.001)
    assert h[1]["cost_usd"] is None and all(t["cumulative_cost_usd"] is None for t in h[1:])
    o = [t for t in rep.turns if t["backend"] == "old"]
    assert [t["prompt_tokens"] for t in o] == [x["context_tokens"] for x in lines if x["type"] == "step"]
    assert all(t["cost_usd"] is None for t in o)
    assert {t["backend"] for t in rep.tasks} == {"openai:m", "old"}
    assert any("1 record(s) without a readable trajectory" in n for n in rep.notes)
