"""A MiniMax-M3 checkpoint directory through the product, end to end on the CPU: `msa-eval run helmet
--backend local --model DIR` and `msa-eval serve --model DIR` driven by the official `openai` client
(real subprocesses; the tiny random checkpoint of `engine.m3.testing`, so the answers are noise)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from engine.m3.testing import text_config, write_checkpoint
from tests.engine.serve_process import running_server


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("m3-e2e") / "tiny-m3"
    write_checkpoint(d, text_config(num_layers=2))
    return d


def _cli(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("msa-eval")
    launcher = [str(exe)] if exe.exists() else [sys.executable, "-m", "msa_eval"]
    return subprocess.run([*launcher, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.slow
def test_run_helmet_local_on_an_m3_directory(m3_dir, tmp_path):
    out = tmp_path / "run"
    r = _cli("run", "helmet", "--backend", "local", "--model", str(m3_dir), "--attention", "msa", "--tasks",
             "niah_single", "--lengths", "2k", "--samples", "1", "--limit", "1", "--out", str(out), "--json",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert records and all(rec.get("error") is None for rec in records), records[:2]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "tiny-m3" in json.dumps(manifest)
    assert (out / "report" / "report.md").is_file()


def test_serve_an_m3_directory_to_the_openai_client(m3_dir):
    from openai import OpenAI

    with running_server("--model", str(m3_dir), "--attention", "msa", "--max-model-len", "4096",
                        "--kv-cache-tokens", "16384") as base:
        client = OpenAI(base_url=base, api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny-m3"]
        chat = client.chat.completions.create(model="tiny-m3", messages=[{"role": "user", "content": "hi " * 300}],
                                              max_tokens=8, temperature=0)
        assert chat.usage.completion_tokens == 8 and chat.choices[0].finish_reason == "length"
        assert chat.usage.prompt_tokens > 900  # the byte-level tokenizer: a truly sparse prompt (> 4 blocks)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tiny-m3", messages=[{"role": "user", "content": "hi " * 300}], max_tokens=8, temperature=0,
            stream=True) if c.choices)
        assert streamed == chat.choices[0].message.content
        done = client.completions.create(model="tiny-m3", prompt="abc", max_tokens=4, temperature=0)
        assert done.usage.completion_tokens == 4
