"""An agent session against a real `msa-eval serve` (default model, CPU) over HTTP: 20 steps
through the real loop, a complete trajectory (per-call usage reported by the server, latency,
messages), and resumable: a run cut after a crash continues to the same 20 steps.
Whether the 135M model solves the task does not matter; the harness must hold."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from agents.config import AgentConfig, AgentLimits
from agents.run_one import run_task
from agents.trajectory import read_trajectory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    exe = str(Path(sys.executable).parent / "msa-eval")
    proc = subprocess.Popen([exe, "serve", "--port", str(port), "--device", "cpu", "--max-batch", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"msa-eval serve exited: {proc.stderr.read().decode()[-1500:]}")
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            assert time.monotonic() < deadline, "msa-eval serve did not come up in 180 s"
            time.sleep(0.5)
    yield url + "/v1"
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_twenty_step_session_over_http_is_complete_and_resumable(server, agent_cache, tmp_path):
    from agents.families import get_family
    from msa_eval.backends.factory import make_backend

    task = get_family("needle").generate(0, 1)[0]
    backend = make_backend("openai", base_url=server, model="smollm2-135m")
    cfg = AgentConfig(AgentLimits(max_steps=20, max_output_tokens=12, context_window=8192,
                                  max_consecutive_format_errors=100), context_policy="truncate-observations",
                      explicit_limits=("max_steps",))
    path = tmp_path / "serve.jsonl"
    res = run_task(task, backend, cfg, path)
    assert res.status in ("step_limit", "submitted") and res.steps == (20 if res.status == "step_limit" else res.steps)
    t = read_trajectory(path)
    assert t.header["backend"]["model"] == "smollm2-135m" and t.result["status"] == res.status
    assert [s["step"] for s in t.steps] == list(range(1, res.steps + 1))
    for s in t.steps:
        assert s["usage"]["reported"] and s["usage"]["prompt_tokens"] > 0 and s["latency_s"] > 0
        assert s["messages"][0]["role"] == "assistant" and len(s["messages"]) >= 2
    assert res.peak_context_tokens == max(s["usage"]["prompt_tokens"] for s in t.steps)

    # crash after step 19: drop the last step and the result line, then resume against the server
    keep, n_steps = [], 0
    for ln in path.read_text().splitlines():
        kind = json.loads(ln)["type"]
        if kind == "result" or (kind == "step" and n_steps == res.steps - 1):
            break
        n_steps += kind == "step"
        keep.append(ln)
    path.write_text("\n".join(keep) + "\n")
    again = run_task(task, backend, cfg, path, resume=True)
    t2 = read_trajectory(path)
    assert again.steps == res.steps == len(t2.steps)
    assert [s["step"] for s in t2.steps] == list(range(1, res.steps + 1))
    assert t2.header == t.header and t2.result["status"] == again.status
