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
