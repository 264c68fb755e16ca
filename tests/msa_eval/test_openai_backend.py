"""The `openai` backend against a local scripted OpenAI-compatible server (no network)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from msa_eval.backends.base import BackendError, GenRequest
from msa_eval.backends.endpoints import load_preset, preset_names
from msa_eval.backends.openai_backend import ContextLimitError, EndpointConfigError, OpenAIBackend, OpenAIBackendConfig
from msa_eval.backends.pricing import PriceTable
from tests.msa_eval.scripted_openai_server import ScriptedOpenAI

KEY_ENV = "MSA_EVAL_TEST_KEY"
SECRET = "sk-test-secret-123"


@pytest.fixture
def prices(tmp_path: Path) -> str:
    p = tmp_path / "prices.yaml"
    p.write_text("models:\n  priced-model: {input_per_mtok: 2.0, output_per_mtok: 10.0}\n")
    return str(p)


def backend(server: ScriptedOpenAI, **kw) -> OpenAIBackend:
    opts = dict(base_url=server.base_url, model="priced-model", api_key_env=KEY_ENV, backoff_initial_s=0.01,
                backoff_max_s=0.05, max_retries=3)
    opts.update(kw)
    return OpenAIBackend(OpenAIBackendConfig(**opts))


def chat_request(i: int = 0, **kw) -> GenRequest:
    return GenRequest(id=f"r{i}", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=16, **kw)


@pytest.mark.parametrize("stream", [True, False])
def test_retries_429_and_500_then_succeeds(monkeypatch, prices, stream):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI(script=[429, 500]) as server:
        b = backend(server, prices_path=prices, stream=stream)
        [r] = b.generate([chat_request()])
        b.close()
    assert r.error is None and r.text == server.text and r.finish_reason == "stop"
    assert len(server.requests) == 3 and b.retries == 2
    assert (r.prompt_tokens, r.completion_tokens) == (7, 5)
    assert r.extra["cost_usd"] == pytest.approx((7 * 2.0 + 5 * 10.0) / 1e6)
    assert (r.ttft_s is not None) == stream and r.latency_s > 0
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"


def test_exhausted_retries_become_an_error_result_and_other_requests_survive(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI(script=[500, 500, 500], default_status=200) as server:
        b = backend(server, max_retries=2, max_concurrency=1)
        first, second = b.generate([chat_request(0), chat_request(1)])
        b.close()
    assert first.finish_reason == "error" and "500" in first.error and "after 2 retries" in first.error
    assert second.error is None and second.text == server.text
    assert len(server.requests) == 4


def test_client_errors_are_not_retried(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI(default_status=400) as server:
        b = backend(server)
        [r] = b.generate([chat_request()])
        b.close()
        assert r.finish_reason == "error" and len(server.requests) == 1
    with ScriptedOpenAI(default_status=401) as server:
        b = backend(server)
        with pytest.raises(EndpointConfigError, match=KEY_ENV):
            b.generate([chat_request()])
        assert len(server.requests) == 1


def test_timeout_is_retried_then_reported(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI(delay_s=1.0) as server:
        b = backend(server, timeout_s=0.2, max_retries=1)
        [r] = b.generate([chat_request()])
        b.close()
    assert r.finish_reason == "error" and "Timeout" in r.error and len(server.requests) == 2


def test_response_cache_replays_without_http_and_never_stores_the_key(monkeypatch, tmp_path, prices):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI() as server:
        b = backend(server, cache_dir=str(tmp_path / "cache"), prices_path=prices)
        first = b.generate([chat_request(i) for i in range(3)])
        again = b.generate([chat_request(i) for i in range(3)])
        other_seed = b.generate([chat_request(0, seed=7)])
        b.close()
    assert len(server.requests) == 4  # 3 first calls + the request with a different seed
    assert [r.text for r in again] == [r.text for r in first]
    assert all(r.extra["cached"] for r in again) and not any(r.extra["cached"] for r in first + other_seed)
    assert again[0].extra["cost_usd"] == first[0].extra["cost_usd"]
    files = list((tmp_path / "cache").rglob("*.json"))
    assert len(files) == 4 and all(SECRET not in f.read_text() for f in files)
    assert SECRET not in json.dumps(b.describe())


def test_concurrency_cap(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI(delay_s=0.2) as server:
        b = backend(server, max_concurrency=2)
        results = b.generate([chat_request(i) for i in range(6)])
        b.close()
    assert all(r.error is None for r in results) and server.max_inflight == 2


def test_completion_endpoint_and_unknown_price(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI() as server:
        b = backend(server, model="model-without-price")
        [r] = b.generate([GenRequest(id="p", prompt="Once upon a time", max_tokens=5, stop=["\n"], seed=3)])
        b.close()
    sent = server.requests[0]
    assert sent["path"] == "/v1/completions" and sent["body"]["prompt"] == "Once upon a time"
    assert sent["body"]["stop"] == ["\n"] and sent["body"]["seed"] == 3 and sent["body"]["max_tokens"] == 5
    assert r.text == server.text and r.extra["cost_usd"] is None


def test_missing_key_for_a_remote_endpoint_is_a_config_error(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    b = OpenAIBackend(OpenAIBackendConfig(base_url="https://api.example.invalid/v1", model="m", api_key_env=KEY_ENV))
    with pytest.raises(EndpointConfigError, match=f"set the environment variable {KEY_ENV}"):
        b.generate([chat_request()])


def test_context_guard_and_provider_context_error(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with ScriptedOpenAI() as server:
        cfg = OpenAIBackendConfig(base_url=server.base_url, model="m", api_key_env=KEY_ENV, context_window=20)
        b = OpenAIBackend(cfg, token_counter=lambda text: len(text.split()))
        [r] = b.generate([GenRequest(id="long", prompt="word " * 10, max_tokens=16)])
        assert r.finish_reason == "error" and "context window 20" in r.error and not server.requests
        assert b.count_tokens("a b c") == 3
    too_long = "This model's maximum context length is 4096 tokens"
    with ScriptedOpenAI(default_status=400, error_message=too_long) as server:
        b = backend(server)
        with pytest.raises(ContextLimitError, match="4096"):
            b.chat([{"role": "user", "content": "hi"}])
        assert len(server.requests) == 1


@pytest.mark.parametrize("stream", [True, False])
def test_chat_with_tools_returns_tool_calls(monkeypatch, stream):
    monkeypatch.setenv(KEY_ENV, SECRET)
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    tools = [{"type": "function",
              "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    with ScriptedOpenAI(tool_call=call) as server:
        b = backend(server, stream=stream)
        resp = b.chat([{"role": "user", "content": "weather?"}], tools=tools, max_tokens=32)
        b.close()
    assert server.requests[0]["body"]["tools"] == tools
    got = [(c.id, c.name, json.loads(c.arguments)) for c in resp.tool_calls]
    assert got == [("call_9", "get_weather", {"city": "Rome"})]
    assert resp.finish_reason == "tool_calls" and resp.content is None


def test_presets_and_price_table_are_valid():
    names = preset_names()
    assert {"minimax", "together", "openrouter", "local-vllm", "local-sglang", "msa-eval-serve"} <= set(names)
    for n in names:
        p = load_preset(n)
        assert p.base_url.startswith(("http://", "https://")) and p.model
    table = PriceTable.load()
    assert table.cost("smollm2-135m", 1000, 1000) == 0.0 and table.cost("unlisted", 10, 10) is None
    with pytest.raises(Exception, match="unknown endpoint preset"):
        load_preset("no-such-preset")
    with pytest.raises(BackendError):
        OpenAIBackend(OpenAIBackendConfig(base_url="http://127.0.0.1:9/v1", model="m")).generate(
            [GenRequest(id="x", prompt="a", messages=[{"role": "user", "content": "b"}])])
