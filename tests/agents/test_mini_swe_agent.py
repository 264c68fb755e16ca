"""mini-swe-agent, the real PyPI package (its `mini` CLI, litellm's openai provider, its local environment),
against a real `msa-eval serve` on 127.0.0.1 (the default model, dense, CPU) on the smoke suite's regression
task, through `msa-eval agent mini-swe-agent`: the loop's requests reach our server (/metrics), its
trajectory is saved and converted step by step, our verifier's verdict is recorded and `msa-eval report`
reads it beside our own agent's run. The 135M model does not fix the bug; the same trajectory graded on a
working tree repaired by a scripted edit passes, so the grade is not constant.

Three steps of at most 24 tokens (about 1.2K-token prompts): mini-swe-agent ends in 30-60 s on 2 CPU cores.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess

import httpx
import pytest

from agents.converters.mini_swe_agent import read_mini_trajectory
from agents.errors import AgentHarnessError
from tests.engine.serve_process import running_server
from tests.msa_eval.conftest import msa_eval_cmd

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(importlib.util.find_spec("minisweagent") is None,
                                 reason="mini-swe-agent is not installed (pip install -e '.[dev]')")]

MAX_STEPS, MAX_TOKENS = 3, 24
KEY = "mini-swe-agent:smollm2-135m"


@pytest.fixture(scope="module")
def server():
    with running_server("--max-model-len", "4096", "--default-max-tokens", "64") as url:
        yield url


def chat_requests(base_url: str) -> float:
    """Successful /v1/chat/completions requests the server counted."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    m = re.search(r'^msa_requests_total\{endpoint="/v1/chat/completions",status="200"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _cli(args, cwd, home, timeout=600):
    env = {**os.environ, "MSA_EVAL_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(msa_eval_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def mini_run(server, agent_home, tmp_path_factory):
    d = tmp_path_factory.mktemp("mini")
    before = chat_requests(server)
    p = _cli(["agent", "mini-swe-agent", "--task", "regression", "--suite", "smoke", "--base-url", server,
              "--max-steps", str(MAX_STEPS), "--max-output-tokens", str(MAX_TOKENS), "--out", str(d / "run"),
              "--json"], d, agent_home)
    assert p.returncode == 0, p.stderr[-3000:]
    return {"dir": d, "run": d / "run", "result": json.loads(p.stdout), "requests": chat_requests(server) - before}


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_the_loop_ran_against_our_server_and_our_verifier_graded_it(mini_run):
    res, run = mini_run["result"], mini_run["run"]
    tid = res["task_id"]
    assert tid.startswith("regression-colorsys-")
    assert 1 <= res["steps"] <= MAX_STEPS and mini_run["requests"] == res["steps"]  # one request per model call
    mini = read_mini_trajectory(run / "mini-swe-agent" / f"{tid}.traj.json")  # its own file, kept
    responses = [m["extra"]["response"] for m in mini["messages"] if isinstance((m.get("extra") or {}).get("response"),
                                                                                   dict)]
    assert len(responses) == res["steps"] and mini["info"]["model_stats"]["api_calls"] == res["steps"]
    assert all(r["model"] == "smollm2-135m" and "msa_eval_timings" in r for r in responses)  # answered by our server
    assert all(r["usage"]["completion_tokens"] <= MAX_TOKENS for r in responses)
    # our trajectory: one step per call, usage as the server reported it, the history growing turn by turn
    traj = _lines(run / "trajectories" / f"{tid}.jsonl")
    steps = [x for x in traj if x["type"] == "step"]
    assert traj[0]["type"] == "header" and traj[0]["external"]["harness"] == "mini-swe-agent"
    assert [s["usage"]["prompt_tokens"] for s in steps] == [r["usage"]["prompt_tokens"] for r in responses]
    prompts = [s["usage"]["prompt_tokens"] for s in steps]
    assert prompts == sorted(prompts) and len(set(prompts)) == len(prompts)
    assert all(s["latency_s"] > 0 and s["usage"]["cost_usd"] == 0.0 for s in steps)  # price table: smollm2 is free
    # the verdict of our verifier (the model does not fix the bug), recorded in the result and the record
    assert res["score"] == 0.0 and res["grade"]["resolved"] == "NO" and res["grade"]["f2p"].startswith("0/")
    assert res["status"] in ("format_errors", "step_limit", "submitted")
    (rec,) = _lines(run / "records.jsonl")
    assert (rec["backend"], rec["score"], rec["grade"], rec["steps"]) == (KEY, 0.0, res["grade"], res["steps"])
    assert rec["prompt_tokens"] == sum(prompts) and rec["peak_context_tokens"] == max(prompts)


@pytest.mark.slow
def test_the_report_reads_it_beside_our_own_agent(mini_run, agent_home):
    d = mini_run["dir"]
    ours = d / "ours"
    p = _cli(["run", "agents", "--suite", "smoke", "--backend", "oracle", "--families", "regression",
              "--sandbox", "local", "--out", str(ours)], d, agent_home)
    assert p.returncode == 0, p.stderr[-3000:]
    p = _cli(["report", str(mini_run["run"]), str(ours), "--out", str(d / "rep"), "--markdown"], d, agent_home)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {(r["backend"], r["family"]): r for r in csv.DictReader((d / "rep" / "agents.csv").open())}
    assert float(rows[(KEY, "regression")]["success_rate"]) == 0.0
    assert float(rows[("oracle", "regression")]["success_rate"]) == 1.0  # the gold replay passes the same verifier
    tasks = {r["backend"]: r for r in csv.DictReader((d / "rep" / "agents_tasks.csv").open())}
    res = mini_run["result"]
    assert int(tasks[KEY]["steps"]) == res["steps"] and float(tasks[KEY]["cost_usd"]) == 0.0
    assert int(tasks[KEY]["total_tokens"]) == res["prompt_tokens"] + res["completion_tokens"]
    assert int(tasks["oracle"]["steps"]) == 5  # run_tests, read_file, str_replace, run_tests, submit
    turns = [r for r in csv.DictReader((d / "rep" / "agents_turns.csv").open()) if r["backend"] == KEY]
    assert [int(t["step"]) for t in turns] == list(range(1, res["steps"] + 1))
    assert int(turns[-1]["cumulative_tokens"]) == int(tasks[KEY]["total_tokens"])
    assert all(int(t["context_growth"]) > 0 for t in turns[1:])
    assert (d / "rep" / "agents_context.png").stat().st_size > 0
    assert f"| {KEY} |" in p.stdout and "Per turn" in p.stdout


@pytest.mark.slow
def test_the_same_trajectory_on_a_repaired_tree_passes(mini_run, agent_cache, tmp_path):
    """Grading is not constant: the working tree repaired by the task's gold edit, then graded with the same
    mini-swe-agent trajectory, scores 1 (FULL)."""
    from agents.external import grade_and_record, workspace_environment
    from agents.suite import find_task, open_suite

    task = find_task(open_suite("smoke", None, agent_cache), mini_run["result"]["task_id"])
    env = workspace_environment(task)
    try:
        for act in task.gold:
            if act["name"] == "str_replace":
                env.call("str_replace", act["arguments"])
        traj = mini_run["run"] / "mini-swe-agent" / f"{task.id}.traj.json"
        res = grade_and_record(task, env, traj, tmp_path / "run", KEY, {"name": "mini-swe-agent"})
    finally:
        env.close()
    assert (res.score, res.grade["resolved"]) == (1.0, "FULL") and res.steps == mini_run["result"]["steps"]
    assert mini_run["result"]["score"] == 0.0


@pytest.mark.parametrize("body", ['{"trajectory_format": "swe-agent-1.0", "messages": []}', "not json", "[]"])
def test_a_trajectory_in_another_format_is_refused_in_one_line(tmp_path, body):
    p = tmp_path / "t.traj.json"
    p.write_text(body)
    with pytest.raises(AgentHarnessError) as e:
        read_mini_trajectory(p)
    assert "formats read: mini-swe-agent-1.x" in str(e.value) and "\n" not in str(e.value)


def _one_line_error(p) -> str:
    assert p.returncode != 0
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    return lines[0]


def test_no_server_at_the_base_url_is_one_line(agent_home, tmp_path):
    from tests.engine.serve_process import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    p = _cli(["agent", "mini-swe-agent", "--task", "regression", "--suite", "smoke", "--base-url", url,
              "--out", str(tmp_path / "run")], tmp_path, agent_home, timeout=300)
    line = _one_line_error(p)
    assert "no OpenAI-compatible server answers" in line and "--base-url" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_model_the_server_does_not_serve_and_a_task_without_a_tree_are_one_line(server, agent_home, tmp_path):
    p = _cli(["agent", "mini-swe-agent", "--task", "regression", "--suite", "smoke", "--base-url", server,
              "--model", "no-such-model", "--out", str(tmp_path / "run")], tmp_path, agent_home, timeout=300)
    assert "does not serve model 'no-such-model'" in _one_line_error(p)
    p = _cli(["agent", "mini-swe-agent", "--task", "ledger", "--suite", "smoke", "--base-url", server,
              "--out", str(tmp_path / "run")], tmp_path, agent_home, timeout=300)
    assert "has no working tree for mini-swe-agent" in _one_line_error(p)
