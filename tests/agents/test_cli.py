"""The agent CLI: list, run, show, and one clear error line for bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import yaml
from pathlib import Path

SUITE = {"suites": {"tiny": {"seed": 0, "families": {"D": [{"n": 1, "n_min": 2, "n_max": 4}], "B": [{"n": 1}]}}}}


def _cli(*args, env=None):
    return subprocess.run([str(Path(sys.executable).parent / "msa-eval"), *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_list_run_show(agent_cache, tmp_path):
    import os

    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump(SUITE))
    env = {**os.environ, "MSA_EVAL_CACHE": str(agent_cache)}
    r = _cli("agent", "list", "--suite", "tiny", "--config", str(cfg), "--json", env=env)
    rows = json.loads(r.stdout)
    assert r.returncode == 0 and sorted(x["family"] for x in rows) == ["B", "D"]
    traj = tmp_path / "t.jsonl"
    r = _cli("agent", "run", "--task", "B", "--suite", "tiny", "--config", str(cfg), "--out", str(traj), "--json", env=env)
    res = json.loads(r.stdout)
    assert r.returncode == 0 and res["score"] == 1.0 and res["status"] == "submitted"
    r = _cli("agent", "show", str(traj), env=env)
    assert r.returncode == 0 and "call search" in r.stdout and "result: submitted" in r.stdout
    r = _cli("agent", "run", "--task", "D:no-such-task", "--suite", "tiny", "--config", str(cfg), env=env)
    assert r.returncode == 2 and "unknown task id 'no-such-task'" in r.stderr and "Traceback" not in r.stderr


def test_repository_without_tests_is_one_clear_error(tmp_path):
    (tmp_path / "lib.py").write_text("def f():\n    return 1\n")
    r = _cli("agent", "run", "--task", "A", "--source", str(tmp_path))
    assert r.returncode == 2 and "has no test_*.py files" in r.stderr and "Traceback" not in r.stderr


def test_show_rejects_a_non_trajectory(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"type": "step"}\n')
    r = _cli("agent", "show", str(p))
    assert r.returncode == 2 and "no header line" in r.stderr
