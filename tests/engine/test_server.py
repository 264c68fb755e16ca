"""The real `msa-eval serve` process driven by the official `openai` client over HTTP.

One server (default model, dense, CPU, capacity 32 = --max-batch 32 --max-queue 0) serves
every test here; the in-process `default_llm` gives the reference outputs.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

import httpx
import openai
import pytest

from engine import SamplingParams
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def base_url():
    with running_server("--max-batch", "32", "--max-queue", "0") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_health_and_models(base_url, client):
    assert httpx.get(base_url.removesuffix("/v1") + "/health").json()["status"] == "ok"
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_greedy_equals_llm_generate(client, default_llm):
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    ref = default_llm.generate([messages], SamplingParams(max_tokens=24))[0]
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_token_ids), len(ref.token_ids))


def test_chat_stream_equals_nonstream_with_usage(client):
    messages = [{"role": "user", "content": "Write one sentence about the moon."}]
    full = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_completion_tokens=20)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=20,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and len(text) > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_stop_string_cuts_text(client, default_llm):
    messages = [{"role": "user", "content": "Count from 1 to 20 separated by commas."}]
    ref = default_llm.generate([messages], SamplingParams(max_tokens=60, stop=["5"]))[0]
    r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=60, stop=["5"])
    assert r.choices[0].message.content == ref.text and "5" not in ref.text
    assert r.choices[0].finish_reason == "stop"


def test_completion_greedy_and_echo_logprobs(client, default_llm):
    prompt = "The three largest cities in Europe are"
    ref = default_llm.generate(prompt, SamplingParams(max_tokens=12))[0]
    r = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12)
    assert r.choices[0].text == ref.text
    # lm-eval local-completions request shape: echo the prompt, one generated token, logprobs=1
    ids = default_llm.tokenizer.encode(prompt, add_special_tokens=True)
    e = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=1, echo=True, logprobs=1)
    lp = e.choices[0].logprobs
    assert e.choices[0].text.startswith(default_llm.tokenizer.decode(ids, skip_special_tokens=False))
    assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
    expected = default_llm.prompt_logprobs(ids + [ref.token_ids[0]], top_n=1)
    assert lp.token_logprobs[1:] == pytest.approx([x for x, _ in expected[1:]], abs=1e-4)
    # the greedy next token has the top logprob (lm-eval's is_greedy check)
    assert lp.token_logprobs[-1] == pytest.approx(max(lp.top_logprobs[-1].values()), abs=1e-6)


def _weather_conversation():
    def call(city, i):
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}
    return [{"role": "user", "content": "Weather in Paris?"}, call("Paris", 1),
            {"role": "user", "content": "Weather in Berlin?"}, call("Berlin", 2),
            {"role": "user", "content": "Weather in Rome?"}]


def test_tool_call_round_trip(client):
    messages = _weather_conversation()
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}
    streamed = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                                   max_tokens=40, stream=True))
    deltas = [tc for c in streamed if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [("get_weather", {"city": "Rome"})]
    # send the call and its result back: the server renders tool messages and answers
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "22 C, clear sky"}]
    again = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], temperature=0,
                                           max_tokens=30)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # tool_choice none hides the tools: plain text, no calls parsed
    plain = client.chat.completions.create(model=MODEL, messages=_weather_conversation(), tools=[WEATHER],
                                           tool_choice="none", temperature=0, max_tokens=40)
    assert plain.choices[0].message.tool_calls is None


def test_32_concurrent_streams_match_sequential(base_url, default_llm):
    # 8 distinct prompts of different lengths, 4 requests each: 32 streams in flight together
    distinct = [f"Give me a fun fact about the number {i}." + " Keep it short." * i for i in range(8)]
    sequential = {p: default_llm.generate([[{"role": "user", "content": p}]], SamplingParams(max_tokens=6))[0].text
                  for p in distinct}
    prompts = [distinct[i % 8] for i in range(32)]

    async def run() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)

        async def one(p: str) -> str:
            stream = await aclient.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}],
                                                           temperature=0, max_tokens=6, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        texts = await asyncio.gather(*(one(p) for p in prompts))
        await aclient.close()
        return list(texts)

    assert asyncio.run(run()) == [sequential[p] for p in prompts]


def test_full_server_answers_429_and_recovers(base_url, client):
    """32 long requests hold every slot (--max-batch 32 --max-queue 0); the 33rd gets 429."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long essay."}], "max_tokens": 1000,
            "temperature": 0, "stream": True, "ignore_eos": True}
    aborted_before = _metric(base_url, "msa_requests_aborted_total")
    with contextlib.ExitStack() as stack:
        for _ in range(32):
            r = stack.enter_context(httpx.stream("POST", base_url + "/chat/completions", json=body, timeout=60))
            assert r.status_code == 200
        with pytest.raises(openai.RateLimitError, match="capacity") as e:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert int(e.value.response.headers["retry-after"]) >= 1  # the client's retries wait for it
    deadline = time.monotonic() + 60  # closing the 32 streams aborts them and frees every slot
    while _metric(base_url, "msa_requests_aborted_total") < aborted_before + 32 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(base_url, "msa_requests_aborted_total") == aborted_before + 32
    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0,
                                        max_tokens=3)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_bad_requests_get_4xx_and_server_keeps_serving(base_url, client):
    url = base_url + "/chat/completions"
    msg = [{"role": "user", "content": "hi"}]
    cases = [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "no-such-model", "messages": msg}, 404, "no-such-model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "word " * 9000}]}, 400, "8192"),
        ({"model": MODEL, "messages": msg, "max_tokens": 9000}, 400, "8192"),
        ({"model": MODEL, "messages": msg, "tools": [{"type": "function", "function": {"description": "no name"}}]},
         400, "name"),
        ({"model": MODEL, "messages": msg,
          "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         400, "object"),
        ({"model": MODEL, "messages": msg, "n": 2}, 400, "n=1"),
        ({"model": MODEL, "messages": msg, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "nope"}}}}, 400, "response_format"),
        ({"model": MODEL,
          "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         400, "messages"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
    ]
    for body, status, needle in cases:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == status, (body if isinstance(body, bytes) else list(body), r.text)
        assert needle in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=msg)
    ok = client.chat.completions.create(model=MODEL, messages=msg, temperature=0, max_tokens=4)
    assert ok.choices[0].message.content


def _wait_for_abort(base_url: str, aborted_before: float) -> None:
    deadline = time.monotonic() + 30
    while _metric(base_url, "msa_requests_aborted_total") == aborted_before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(base_url, "msa_requests_aborted_total") == aborted_before + 1
    assert _metric(base_url, "msa_requests_running") == 0


def test_client_disconnect_aborts_request_and_metrics(base_url):
    aborted_before = _metric(base_url, "msa_requests_aborted_total")
    tokens_before = _metric(base_url, "msa_generation_tokens_total")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
            "max_tokens": 4000, "temperature": 0, "ignore_eos": True}
    with httpx.stream("POST", base_url + "/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    _wait_for_abort(base_url, aborted_before)
    time.sleep(0.5)  # nothing generates any more
    generated = _metric(base_url, "msa_generation_tokens_total") - tokens_before
    assert generated < 4000 and _metric(base_url, "msa_generation_tokens_total") - tokens_before == generated
    # a non-streaming client that gives up (read timeout) is noticed and aborted as well
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base_url + "/chat/completions", json=body, timeout=httpx.Timeout(60, read=2.0))
    _wait_for_abort(base_url, aborted_before + 1)
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    for name in ("msa_requests_total", "msa_request_latency_seconds_bucket", "msa_time_to_first_token_seconds_bucket",
                 "msa_kv_cache_usage_ratio", "msa_queue_depth"):
        assert name in text


def test_lm_eval_local_completions_loglikelihood(base_url, default_llm):
    """lm-eval's own `local-completions` client (remote tokenizer endpoints, echo + logprobs)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("aiohttp")
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(model=MODEL, base_url=base_url + "/completions", tokenizer_backend="remote",
                             max_length=2048, max_retries=1)
    pairs = [("The capital of France is", " Paris"), ("The capital of France is", " a banana split"),
             ("One, two, three,", " four")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)], disable_tqdm=True)
    tok = default_llm.tokenizer
    for (ctx, cont), (logprob, greedy) in zip(pairs, got, strict=True):
        whole, n_ctx = tok.encode(ctx + cont), len(tok.encode(ctx))
        rows = default_llm.prompt_logprobs(whole, top_n=1)[n_ctx:]
        assert logprob == pytest.approx(sum(lp for lp, _ in rows), abs=1e-3)
        assert greedy == all(lp >= max(top.values()) - 1e-6 for lp, top in rows)
    assert got[0][0] > got[1][0]  # " Paris" is far likelier than " a banana split"


def test_lm_eval_rolling_loglikelihood_equals_the_bridge(base_url, default_llm):
    """lm-eval's `local-completions` rolling log-likelihood through our server equals our in-process
    `msa-local` bridge's on the same text: both start windows with the tokenizer's BOS (the bridge used EOS)."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("aiohttp")
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from msa_eval.lm_eval_bridge import MsaLocalLM

    text = "The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks struck."
    req = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    lm = LocalCompletionsAPI(model=MODEL, base_url=base_url + "/completions", tokenizer_backend="remote",
                             max_length=2048, max_retries=1)
    [remote] = lm.loglikelihood_rolling(req, disable_tqdm=True)
    bridge = MsaLocalLM(model="smollm2-135m", attention="dense")
    assert lm.prefix_token_id == bridge.prefix_token_id == default_llm.tokenizer.bos_token_id
    [local] = bridge.loglikelihood_rolling(req, disable_tqdm=True)
    assert remote == pytest.approx(local, abs=1e-3) and remote < 0
