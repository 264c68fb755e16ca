"""The agent CLI: list (at once, from the config and the cache), run, show, the one cache root,
and one clear error line for bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

# An old suite, written with letters: it still works, and shows the families by name.
SUITE = {"suites": {"tiny": {"seed": 0, "families": {"D": [{"n": 1, "n_min": 2, "n_max": 4}], "B": [{"n": 1}]}}}}


def _cli(*args, env=None):
    return subprocess.run([str(Path(sys.executable).parent / "msa-eval"), *args], capture_output=True, text=True,
                          timeout=300, env=env)


def _home_env(home, **more):
    env = {k: v for k, v in os.environ.items() if k != "MSA_EVAL_CACHE"}
    return {**env, "MSA_EVAL_HOME": str(home), **more}


def test_list_run_show(agent_home, tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump(SUITE, sort_keys=False))
    env = _home_env(agent_home)
    r = _cli("agent", "list", "--suite", "tiny", "--config", str(cfg), "--json", env=env)
    rows = json.loads(r.stdout)
    assert r.returncode == 0 and [x["family"] for x in rows] == ["ledger", "needle"]
    traj = tmp_path / "t.jsonl"
    r = _cli("agent", "run", "--task", "needle", "--suite", "tiny", "--config", str(cfg), "--out", str(traj), "--json",
             env=env)
    res = json.loads(r.stdout)
    assert r.returncode == 0 and res["score"] == 1.0 and res["status"] == "submitted", r.stderr
    assert res["task_id"].startswith("needle-") and res["family"] == "needle"
    r = _cli("agent", "list", "--suite", "tiny", "--config", str(cfg), "--json", env=env)
    needle = json.loads(r.stdout)[1]
    assert needle["cache"] == "cached" and [t["id"] for t in needle["tasks"]] == [res["task_id"]]
    r = _cli("agent", "show", str(traj), env=env)
    assert r.returncode == 0 and "call search" in r.stdout and "result: submitted" in r.stdout
    r = _cli("agent", "run", "--task", "D:no-such-task", "--suite", "tiny", "--config", str(cfg), env=env)
    assert r.returncode == 2 and "unknown task id 'no-such-task'" in r.stderr and "Traceback" not in r.stderr
    r = _cli("agent", "run", "--task", "B", "--suite", "tiny", "--config", str(cfg), "--out", str(tmp_path / "b.jsonl"),
             "--json", env=env)  # the letter names the same task, read from the cache
    assert r.returncode == 0 and json.loads(r.stdout)["task_id"] == res["task_id"]


def test_list_answers_without_generating(tmp_path):
    """A cold list of the default suite prints every entry and writes nothing (generation would take minutes);
    the table shows names and says how to generate."""
    home = tmp_path / "home"
    t0 = time.monotonic()
    r = _cli("agent", "list", env=_home_env(home, COLUMNS="200"))
    wall = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    for fam in ("regression", "needle", "rename", "ledger"):
        assert fam in r.stdout and f"{fam}: " in r.stderr  # the rows, then one description per family
    assert "6 of 6 entries not generated yet" in r.stderr and "agent list --validate" in r.stderr
    assert not (home / "agent-suites").exists()
    assert wall < 30, wall  # generating the default suite takes minutes; listing is ~1 s (loose bound: shared CI)


def test_old_cache_variable_gets_a_note_and_home_is_used(tmp_path):
    old = tmp_path / "old-cache"
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump(SUITE, sort_keys=False))
    env = _home_env(tmp_path / "home", MSA_EVAL_CACHE=str(old))
    r = _cli("agent", "run", "--task", "ledger", "--suite", "tiny", "--config", str(cfg), "--out",
             str(tmp_path / "t.jsonl"), "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("MSA_EVAL_CACHE is no longer read") == 1 and "MSA_EVAL_HOME" in r.stderr
    assert not old.exists() and list((tmp_path / "home" / "agent-suites").glob("ledger-*.jsonl"))
    r = _cli("agent", "list", "--suite", "tiny", "--config", str(cfg), env=_home_env(tmp_path / "home"))
    assert r.returncode == 0 and "MSA_EVAL_CACHE" not in r.stderr


def test_unknown_family_in_a_filter_or_a_suite_is_one_line(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump({"suites": {"bad": {"families": {"E": [{}]}}}}))
    env = _home_env(tmp_path / "home")
    r = _cli("agent", "list", "--suite", "bad", "--config", str(cfg), env=env)
    assert r.returncode == 2 and "unknown task family 'E'; families are regression, needle, rename, ledger" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli("run", "agents", "--families", "needle,Q", "--limit", "1", env=env)
    assert r.returncode == 2 and "unknown task family 'Q'" in r.stderr and "Traceback" not in r.stderr


def test_repository_without_tests_is_one_clear_error(tmp_path):
    (tmp_path / "lib.py").write_text("def f():\n    return 1\n")
    r = _cli("agent", "run", "--task", "regression", "--source", str(tmp_path))
    assert r.returncode == 2 and "has no test_*.py files" in r.stderr and "Traceback" not in r.stderr


def test_show_rejects_a_non_trajectory(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"type": "step"}\n')
    r = _cli("agent", "show", str(p))
    assert r.returncode == 2 and "no header line" in r.stderr
