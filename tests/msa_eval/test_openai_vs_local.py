"""`--backend openai` against the real `msa-eval serve` gives what `--backend local` gives, sample by sample.

The real commands in subprocesses: `msa-eval serve` on 127.0.0.1 (default model, dense, then MSA with the
suite's top-k), `msa-eval run helmet --backend openai --base-url ... --tokenizer <the checkpoint>` and
`msa-eval run helmet --backend local --attention dense,msa` on the same recall tasks, lengths and samples
(greedy). Same sample ids and prompt hashes, same output texts, same scores; the openai records also carry
the server's timing split (queue_s, prefill_s, decode_s) and the report its latency table.
One request at a time on both sides (`--concurrency 1`), so that both run the same shapes: the comparison
is of the two paths, not of the engine's batch invariance. The lead's 8K run: `LENGTH=8k` below, on a GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
TASKS, LENGTH, SAMPLES = "niah_single,niah_mk2", "1k", "2"
MSA_TOPK = "4"  # configs/helmet.yaml's msa_overrides: the local msa arm runs with it; the server is told


def _msa_eval(*args: str, timeout: int = 600) -> None:
    p = subprocess.run([sys.executable, "-m", "msa_eval", *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stderr[-3000:]


def _run(out: Path, *backend: str) -> dict[tuple[str, str], dict]:
    _msa_eval("run", "helmet", *backend, "--tasks", TASKS, "--lengths", LENGTH, "--samples", SAMPLES,
              "--concurrency", "1", "--out", str(out), "--json")
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return {(r["backend"].split(":", 1)[1], r["sample_id"]): r for r in rows}


@pytest.fixture(scope="module")
def checkpoint() -> str:
    """The local checkpoint's path: its tokenizer is the one `--tokenizer` gets."""
    from engine.store import ensure

    return str(ensure(MODEL, progress=False))


def test_openai_against_our_server_equals_local(tmp_path, checkpoint):
    local = _run(tmp_path / "local", "--backend", "local", "--attention", "dense,msa", "--no-telemetry")
    served = {}
    for arm, extra in (("dense", ()), ("msa", ("--msa-topk", MSA_TOPK))):
        with running_server("--attention", arm, *extra) as url:
            got = _run(tmp_path / f"openai-{arm}", "--backend", "openai", "--base-url", url, "--model", MODEL,
                       "--tokenizer", checkpoint)
        served.update({(arm, sid): r for (_, sid), r in got.items()})
    assert set(served) == set(local) and len(local) == 2 * 2 * int(SAMPLES)
    for key, ref in local.items():
        r = served[key]
        assert (r["prompt_hash"], r["prompt_tokens"]) == (ref["prompt_hash"], ref["prompt_tokens"]), key
        assert (r["output"], r["score"], r["finish_reason"]) == (ref["output"], ref["score"], ref["finish_reason"]), \
            (key, r["output"], ref["output"])
        assert ref["prompt_format"] == "chat-prefill" and r["prompt_format"] == "chat-prefill-ref"
        assert r["queue_s"] is not None and r["prefill_s"] > 0 and r["cost_usd"] == 0.0  # the server's split
        assert (r["attention_density"] is not None) == (key[0] == "msa")
    report = (tmp_path / "openai-msa" / "report" / "report.md").read_text()
    assert "## Latency and cost per backend x task x length" in report
