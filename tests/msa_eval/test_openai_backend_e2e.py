"""The openai backend against the real `msa-eval serve` (dense, CPU, default model).

Cross-checks: the backend's outputs equal `engine.LLM.generate` for the same prompts; tool
calls come back parsed; and `msa-eval run helmet` through the openai backend gives the same
per-sample outputs and scores as the in-process local backend with dense attention (tiny
size: 3 tasks x 1 sample at 512 tokens).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import SamplingParams
from msa_eval.backends import local as _local_backend  # noqa: F401  (the local side of the comparison)
from msa_eval.backends.base import GenRequest
from msa_eval.backends.factory import make_backend
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
ARGS = ["--lengths", "512", "--samples", "1", "--tasks", "niah_single,json_kv,longqa_mc", "--json"]


@pytest.fixture(scope="module")
def base_url():
    with running_server("--attention", "dense") as url:
        yield url


def test_backend_generate_equals_llm_generate(base_url, default_llm, tmp_path):
    backend = make_backend("openai", base_url=base_url, model=MODEL, cache_dir=str(tmp_path / "cache"))
    chat = [{"role": "user", "content": "What is the tallest mountain on Earth?"}]
    reqs = [GenRequest(id="chat", messages=chat, max_tokens=20),
            GenRequest(id="text", prompt="A list of three fruits: apple,", max_tokens=12, stop=["\n"])]
    out = backend.generate(reqs)
    ref = default_llm.generate([chat, reqs[1].prompt],
                               [SamplingParams(max_tokens=20), SamplingParams(max_tokens=12, stop=["\n"])])
    assert [r.text for r in out] == [o.text for o in ref]
    assert [r.prompt_tokens for r in out] == [len(o.prompt_token_ids) for o in ref]
    assert all(r.ttft_s is not None and r.ttft_s <= r.latency_s for r in out)
    assert [r.extra["cost_usd"] for r in out] == [0.0, 0.0]  # priced at 0 in configs/prices.yaml
    assert [r.text for r in backend.generate(reqs)] == [r.text for r in out]  # replayed from the cache
    backend.close()


def test_backend_chat_tool_call_through_server(base_url):
    backend = make_backend("openai", base_url=base_url, model=MODEL)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

    def call(city, i):
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}

    messages = [{"role": "user", "content": "Weather in Paris?"}, call("Paris", 1),
                {"role": "user", "content": "Weather in Berlin?"}, call("Berlin", 2),
                {"role": "user", "content": "Weather in Rome?"}]
    resp = backend.chat(messages, tools=tools, max_tokens=40)
    backend.close()
    assert resp.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in resp.tool_calls] == [("get_weather", {"city": "Rome"})]


def _run(out: Path, *backend_args: str) -> dict[str, dict]:
    exe = Path(sys.executable).with_name("msa-eval")
    proc = subprocess.run([str(exe), "run", "helmet", *backend_args, *ARGS, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    return {r["sample_id"]: r for r in records}


def test_helmet_over_http_matches_local_dense(base_url, tmp_path):
    remote = _run(tmp_path / "openai", "--backend", "openai", "--base-url", base_url, "--model", MODEL)
    assert any((tmp_path / "openai" / "cache").rglob("*"))  # default response cache: <run dir>/cache
    local = _run(tmp_path / "local", "--backend", "local", "--attention", "dense")
    assert sorted(remote) == sorted(local) and len(local) == 3
    for sid, r in remote.items():
        assert r["status"] == local[sid]["status"] == "ok", (sid, r.get("error"), local[sid].get("error"))
        assert (r["output"], r["score"]) == (local[sid]["output"], local[sid]["score"]), sid
        assert r["prompt_tokens"] == local[sid]["prompt_tokens"], sid
    # the needle's answer prefix is continued: own template (local), reference template over /completions
    assert (remote["niah_single/512/0000"]["prompt_format"], local["niah_single/512/0000"]["prompt_format"]) == \
        ("chat-prefill-ref", "chat-prefill")
