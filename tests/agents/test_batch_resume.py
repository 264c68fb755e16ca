"""Kill -9 a real `msa-eval run agents` subprocess mid-batch, rerun it: finished tasks are not
redone, the interrupted task continues from its trajectory, every task ends with one record."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

SUITE = {"suites": {"killme": {"seed": 0, "families": {
    "ledger": [{"n": 2, "n_min": 2, "n_max": 4},
          {"n": 1, "scope": "email", "exception": "HeaderParseError", "include_methods": True}]}}}}


def _cmd(config: Path, out: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "msa-eval"), "run", "agents", "--suite", "killme",
            "--config", str(config), "--out", str(out), "--json"]


def _steps(p: Path) -> int:
    return sum(1 for line in p.read_text().splitlines() if line.startswith('{"type": "step"')) if p.exists() else 0


def test_kill_minus_nine_then_rerun_resumes(agent_home, agent_cache, tmp_path):
    from agents.suite import load_suite

    config = tmp_path / "agents.yaml"
    config.write_text(yaml.safe_dump(SUITE))
    tasks = load_suite("killme", config, cache=agent_cache)  # generated once, cached for the subprocesses
    long_id = tasks[-1].id
    out = tmp_path / "run"
    env = {**os.environ, "MSA_EVAL_HOME": str(agent_home)}
    proc = subprocess.Popen(_cmd(config, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    long_traj = out / "trajectories" / f"{long_id}.jsonl"
    deadline = time.monotonic() + 120
    while _steps(long_traj) < 50:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the batch did not reach the long task"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    finished = {r["task_id"] for r in records}
    assert len(finished) == 2 and long_id not in finished
    before = {t: (out / "trajectories" / f"{t}.jsonl").read_bytes() for t in finished}
    steps_at_kill = _steps(long_traj)

    r = subprocess.run(_cmd(config, out), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(x["task_id"] for x in records) == sorted(t.id for t in tasks)  # one record each
    assert all(x["score"] == 1.0 and x["status"] == "submitted" for x in records)
    assert {t: (out / "trajectories" / f"{t}.jsonl").read_bytes() for t in finished} == before  # not redone
    lines = [json.loads(x) for x in long_traj.read_text().splitlines()]
    assert [x["type"] for x in lines].count("header") == 1
    steps = [x["step"] for x in lines if x["type"] == "step"]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > steps_at_kill
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and set(manifest["tasks"]) == {t.id for t in tasks}
