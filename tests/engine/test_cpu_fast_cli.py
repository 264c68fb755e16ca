"""`msa-eval generate --weights`: the CPU weight mode from the command line (real subprocess, real model)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

CLI = [sys.executable, "-m", "msa_eval.cli"]


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=e, timeout=300)


def test_generate_q4_answers_paris(default_llm):
    r = run_cli("generate", "--device", "cpu", "--weights", "q4", "--json", "--chat", "--max-tokens", "12",
                "What is the capital of France?", env={"MSA_EVAL_WEIGHTS": "bf16"})  # the flag wins over the env
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["weights"] == "q4" and "Paris" in out["text"]


def test_generate_rejects_unknown_weight_mode():
    r = run_cli("generate", "--weights", "int8", "hi")
    assert r.returncode != 0
    assert "--weights" in r.stderr and "'q4'" in r.stderr
