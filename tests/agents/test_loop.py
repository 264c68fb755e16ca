"""The agent loop on real environments, driven by the oracle policy (the one scripted model):
format errors returned to the model, the error cap, the text protocol, limits and their exit
statuses, context policies recorded as events, and resume from a torn trajectory."""
from __future__ import annotations

import json

import pytest

from agents.config import AgentConfig, AgentLimits
from agents.oracle import OraclePolicy
from agents.run_one import run_task
from agents.trajectory import read_trajectory

BAD = [
    {"name": "get_owner", "arguments": '{"module": "email.utils"'},  # malformed JSON
    {"name": "frobnicate", "arguments": {}},  # unknown tool
    {"name": "get_function", "arguments": {}},  # missing argument
    {"name": "get_function", "arguments": {"qualname": "email.nope:x"}},  # wrong value
]


def _run(task, gold, tmp_path, name="t.jsonl", **cfg):
    limits = cfg.pop("limits", {})
    return run_task(task, OraclePolicy(gold), AgentConfig(AgentLimits(**limits), **cfg), tmp_path / name,
                    override_task_limits=True)


def test_bad_tool_calls_become_error_results_and_the_run_still_succeeds(d_task, tmp_path):
    res = _run(d_task, BAD[:2] + [d_task.gold[0]] + BAD[2:] + d_task.gold[1:], tmp_path, limits={"max_steps": 500})
    assert res.status == "submitted" and res.score == 1.0
    assert res.format_errors == 3  # malformed JSON, unknown tool, missing argument
    t = read_trajectory(tmp_path / "t.jsonl")
    outs = [s["messages"][1]["content"] for s in t.steps[:5]]
    assert "not a valid JSON object" in outs[0] and "unknown tool 'frobnicate'" in outs[1]
    assert "missing required argument 'qualname'" in outs[3] and "no function 'email.nope:x'" in outs[4]


def test_consecutive_format_errors_end_the_run_and_it_is_still_graded(d_task, tmp_path):
    res = _run(d_task, BAD[:1] * 5, tmp_path, limits={"max_consecutive_format_errors": 3})
    assert res.status == "format_errors" and res.steps == 3 and res.score == 0.0
    assert read_trajectory(tmp_path / "t.jsonl").result["grade"]["state_ok"] is False


def test_text_protocol_fallback_solves_the_task(d_task, tmp_path):
    res = _run(d_task, d_task.gold, tmp_path, tool_mode="text", limits={"max_steps": 500})
    assert res.status == "submitted" and res.score == 1.0
    t = read_trajectory(tmp_path / "t.jsonl")
    assert "<tool_call>" in t.header["messages"][0]["content"]
    assert all(s["response"]["parsed_from_text"] for s in t.steps)
    assert t.steps[0]["messages"][1]["content"].startswith('<tool_result name="search_functions">')


@pytest.mark.parametrize("limits,status", [({"max_steps": 4}, "step_limit"),
                                           ({"max_total_tokens": 1500}, "token_limit"),
                                           ({"max_wall_s": 0.0}, "wall_time_limit"),
                                           ({"context_window": 900}, "context_overflow")])
def test_limits_have_named_exit_statuses_and_are_graded(d_task, tmp_path, limits, status):
    res = _run(d_task, d_task.gold, tmp_path, limits=limits)
    assert res.status == status and res.score == 0.0
    assert read_trajectory(tmp_path / "t.jsonl").result["status"] == status


def test_truncate_observations_policy_is_recorded(d_task, tmp_path):
    res = _run(d_task, d_task.gold, tmp_path, context_policy="truncate-observations", limits={"max_steps": 500})
    assert res.score == 1.0 and res.policy_events >= 1
    ev = read_trajectory(tmp_path / "t.jsonl").events
    assert ev[0]["kind"] == "truncate-observations"
    assert ev[-1]["detail"]["tokens_after"] < ev[-1]["detail"]["tokens_before"]


def test_summarize_policy_compacts_and_keeps_the_full_history(d_task, tmp_path):
    res = _run(d_task, d_task.gold, tmp_path, context_policy="summarize",
               limits={"max_steps": 500, "context_window": 1500})
    assert res.status == "submitted" and res.score == 1.0
    t = read_trajectory(tmp_path / "t.jsonl")
    summaries = [e for e in t.events if e["kind"] == "summarize"]
    assert summaries and all("oracle summary" in e["detail"]["text"] for e in summaries)
    assert max(s["context_tokens"] for s in t.steps) <= 1500 < res.trajectory_tokens
    assert len(t.history()) == 2 + sum(len(s["messages"]) for s in t.steps)


def test_resume_after_a_crash_mid_trajectory(d_task, tmp_path):
    full = run_task(d_task, "oracle", AgentConfig(), tmp_path / "full.jsonl")
    lines = (tmp_path / "full.jsonl").read_text().splitlines()
    cut = lines[: 1 + len(d_task.gold) // 2]  # header + half the steps
    (tmp_path / "crash.jsonl").write_text("\n".join(cut) + "\n" + lines[len(cut)][:40])  # torn last line
    res = run_task(d_task, "oracle", AgentConfig(), tmp_path / "crash.jsonl", resume=True)
    assert res.status == "submitted" and res.score == 1.0 and res.steps == full.steps
    t = read_trajectory(tmp_path / "crash.jsonl")
    assert [s["step"] for s in t.steps] == list(range(1, full.steps + 1))
    again = run_task(d_task, "oracle", AgentConfig(), tmp_path / "crash.jsonl", resume=True)
    assert again.to_dict() == res.to_dict()  # a finished trajectory is not rerun


def test_resume_restores_a_workspace(small_tasks, tmp_path):
    task = small_tasks["regression"][0]
    path = tmp_path / "a.jsonl"
    run_task(task, "oracle", AgentConfig(), path)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:4]) + "\n")  # header + 3 steps: the fix is applied, not submitted
    assert "checkpoint" in json.loads(lines[3])
    # the resumed oracle continues after the edit (run_tests, submit): the fix must come from the checkpoint
    res = run_task(task, "oracle", AgentConfig(), path, resume=True)
    assert res.status == "submitted" and res.score == 1.0 and res.steps == 5
    assert [s["response"]["tool_calls"][0]["name"] for s in read_trajectory(path).steps[3:]] == ["run_tests", "submit"]
