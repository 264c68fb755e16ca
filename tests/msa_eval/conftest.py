import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def msa_eval_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "from msa_eval.cli import main; main()", *args]


@pytest.fixture
def run_cli(tmp_path):
    """Run `msa-eval ARGS` in a subprocess from tmp_path; returns CompletedProcess."""
    def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        env = {**os.environ, "COLUMNS": "200"}
        return subprocess.run(msa_eval_cmd(*args), cwd=tmp_path, capture_output=True, text=True,
                              timeout=timeout, env=env)
    return _run


@pytest.fixture(scope="session")
def needle_run(tmp_path_factory):
    """A real run of the default model, dense attention, single needle at 2K (3 samples),
    killed with SIGKILL after its first record and then resumed by the same command.
    Returns a dict with the run dir, the records seen before the kill and both outputs."""
    import signal
    import time

    d = tmp_path_factory.mktemp("needle_run")
    run_dir = d / "run"
    argv = msa_eval_cmd("run", "helmet", "--backend", "local", "--attention", "dense",
                        "--tasks", "niah_single", "--lengths", "2k", "--samples", "3",
                        "--out", str(run_dir))
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen(argv, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)
    records = run_dir / "records.jsonl"
    deadline = time.time() + 1500
    while time.time() < deadline and proc.poll() is None:
        if records.is_file() and records.read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    first_out, first_err = proc.communicate(timeout=60)
    before = records.read_text() if records.is_file() else ""
    manifest_after_kill = (run_dir / "manifest.json").read_text()
    second = subprocess.run(argv, cwd=d, capture_output=True, text=True, env=env, timeout=2000)
    return {"run_dir": run_dir, "killed": killed, "before": before,
            "manifest_after_kill": manifest_after_kill, "first_err": first_err,
            "second": second}
