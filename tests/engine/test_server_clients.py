"""What real OpenAI-compatible clients send, against the real `msa-eval serve` (issue 21, "the server
speaks what clients send"): `models.retrieve` with the context length, a server-side default for a
missing max_tokens, /metrics labelled by route, the context-length error naming the prompt's field,
lm-eval's chat-templated /tokenize body, and chat logprobs.

One server (default model, dense, CPU, --max-model-len 2048, --default-max-tokens 7, capacity 4)
driven over 127.0.0.1 by the official `openai` client (httpx where the client hides the wire).
"""
from __future__ import annotations

import json
import re
import uuid

import httpx
import openai
import pytest

from tests.engine.openai_shape import assert_openai_error
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 2048
DEFAULT_MAX = 7
MSG = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def base_url():
    with running_server("--max-model-len", str(MAX_MODEL_LEN), "--default-max-tokens", str(DEFAULT_MAX),
                        "--max-batch", "4", "--max-queue", "0", "--served-model-name", "org/alias") as url:
        yield url


@pytest.fixture(scope="module")
def root(base_url):
    return base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def test_models_retrieve_gives_the_card_with_the_context_length(client):
    card = client.models.retrieve(MODEL)
    assert (card.id, card.object, card.model_extra["max_model_len"]) == (MODEL, "model", MAX_MODEL_LEN)
    listed = {m.id: m for m in client.models.list().data}
    assert listed[MODEL] == card and set(listed) == {MODEL, "org/alias"}
    assert client.models.retrieve("org/alias").id == "org/alias"  # a served name with a slash
    for unknown in ("no-such-model", "org/no-such-model"):
        with pytest.raises(openai.NotFoundError) as e:
            client.models.retrieve(unknown)
        assert_openai_error(e.value.response, 404)
        assert (e.value.param, e.value.code) == ("model", "model_not_found") and unknown in e.value.message


def test_a_request_without_max_tokens_generates_at_most_the_server_default(client, base_url):
    r = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, extra_body={"ignore_eos": True})
    assert (r.usage.completion_tokens, r.choices[0].finish_reason) == (DEFAULT_MAX, "length")
    # /v1/completions keeps OpenAI's 16 when max_tokens is left out; an explicit null takes the server's default
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": None, "temperature": 0, "ignore_eos": True}
    c = httpx.post(base_url + "/completions", json=body, timeout=300).json()
    assert c["usage"]["completion_tokens"] == DEFAULT_MAX
    # a limit the client names still wins
    r = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=12,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 12


def test_default_max_tokens_is_capped_by_the_context(default_llm):
    from engine.server.state import ServingState

    state = ServingState(default_llm, None, None, (MODEL,), 0, default_max_tokens=4096)  # type: ignore[arg-type]
    room = default_llm.max_model_len - 10
    assert state.check_length(10, None, "messages") == min(4096, room)
    state.default_max_tokens = room + 100
    assert state.check_length(10, None, "messages") == room
    assert state.check_length(10, 5, "messages") == 5


def test_default_max_tokens_is_a_documented_serve_option():
    from click.testing import CliRunner

    from engine.server.__main__ import parse_args
    from engine.server.config import ServerConfig
    from msa_eval.cli.serve import serve

    help_text = CliRunner().invoke(serve, ["--help"]).output
    assert "--default-max-tokens" in help_text and "4096" in help_text
    assert ServerConfig().default_max_tokens == 4096 == parse_args([])[0].default_max_tokens
    assert parse_args(["--default-max-tokens", "9"])[0].default_max_tokens == 9
    with pytest.raises(ValueError, match="default_max_tokens"):
        ServerConfig(default_max_tokens=0)


def _requests_total(root: str) -> dict[tuple[str, str], float]:
    text = httpx.get(root + "/metrics").text
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(r'^msa_requests_total\{endpoint="([^"]*)",status="(\d+)"\} '
                                                           r'(\S+)$', text, re.M)}


def _series(root: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in httpx.get(root + "/metrics").text.splitlines()
            if line.startswith("msa_request")}


def test_metrics_are_labelled_by_route_template_not_raw_path(root, client):
    card = "/v1/models/{model:path}"
    client.models.retrieve(MODEL)
    httpx.get(f"{root}/v1/{uuid.uuid4().hex}")  # the first unknown path opens the shared "other" series
    httpx.get(f"{root}/v1/models/{uuid.uuid4().hex}")
    before, counts = _series(root), _requests_total(root)
    probes = [uuid.uuid4().hex for _ in range(3)]
    for p in probes[:2]:
        assert httpx.get(f"{root}/v1/{p}/x?y=1").status_code == 404
    assert httpx.get(f"{root}/v1/models/{probes[2]}").status_code == 404
    assert _series(root) == before  # three new URLs, no new series
    after = _requests_total(root)
    assert after[("other", "404")] - counts[("other", "404")] == 2
    assert after[(card, "404")] - counts[(card, "404")] == 1 and after[(card, "200")] >= 1
    assert httpx.post(f"{root}/v1/models/{probes[0]}").status_code == 405  # a wrong method: the route's template
    assert _requests_total(root)[(card, "405")] == 1
    assert not any(p in httpx.get(root + "/metrics").text for p in probes)


def test_context_length_error_names_the_prompt_field(client):
    long_text = "word " * (MAX_MODEL_LEN + 100)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=long_text, max_tokens=1)
    assert (e.value.param, e.value.code) == ("prompt", "context_length_exceeded") and "2048" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[[1] * (MAX_MODEL_LEN + 1)], max_tokens=1)
    assert (e.value.param, e.value.code) == ("prompt", "context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}], max_tokens=1)
    assert (e.value.param, e.value.code) == ("messages", "context_length_exceeded") and "2048" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # room for the prompt, not for the completion
        client.completions.create(model=MODEL, prompt="hi", max_tokens=MAX_MODEL_LEN)
    assert (e.value.param, e.value.code) == ("max_tokens", "context_length_exceeded")


def test_tokenize_takes_the_chat_history_lm_eval_sends(root, base_url, client, default_llm):
    """lm-eval `local-completions --apply_chat_template` with the server's tokenizer sends the chat history itself
    as `prompt`; the server renders it through its chat template (was: 400 "prompt: Input should be a valid
    string"), and lm-eval then generates from those token ids."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("aiohttp")
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    lm = LocalCompletionsAPI(model=MODEL, base_url=base_url + "/completions", tokenizer_backend="remote",
                             max_length=MAX_MODEL_LEN, max_retries=1)
    history = lm.apply_chat_template(MSG)
    [ids] = lm.tok_encode([history])  # POST /tokenize {"prompt": [{"role", "content"}], "add_special_tokens": false}
    tok = default_llm.tokenizer
    assert ids == tok.encode(tok.apply_chat_template(MSG, add_generation_prompt=True), add_special_tokens=False)
    assert httpx.post(root + "/tokenize", json={"messages": MSG}).json()["tokens"] == ids
    [text] = lm.generate_until([Instance("generate_until", {}, (history, {"until": ["\n\n"], "max_gen_toks": 10,
                                                                        "do_sample": False}), 0)], disable_tqdm=True)
    chat = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=10, stop=["\n\n"])
    assert text == chat.choices[0].message.content and text
    err = assert_openai_error(httpx.post(root + "/tokenize", json={"prompt": []}), 400)
    assert err["param"] == "prompt"


def _stream_logprobs(client, **kw) -> tuple[str, list]:
    chunks = list(client.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]


def test_chat_logprobs_match_the_completions_logprobs(root, base_url, client):
    kw = dict(model=MODEL, messages=MSG, temperature=0, max_tokens=8)
    r = client.chat.completions.create(logprobs=True, top_logprobs=3, **kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for e in content:  # greedy: the chosen token is the likeliest, and it heads its alternatives
        assert len(e.top_logprobs) == 3 and e.bytes == list(e.token.encode())
        assert e.logprob == pytest.approx(max(t.logprob for t in e.top_logprobs), abs=1e-6)
        assert e.top_logprobs[0].token == e.token
    # the same prompt's token ids through /v1/completions: the same tokens and numbers
    ids = httpx.post(root + "/tokenize", json={"messages": MSG}).json()["tokens"]
    assert len(ids) == r.usage.prompt_tokens
    c = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=8, logprobs=3)
    lp = c.choices[0].logprobs
    assert [e.token for e in content] == lp.tokens
    assert [e.logprob for e in content] == pytest.approx(lp.token_logprobs, abs=1e-5)
    for e, top in zip(content, lp.top_logprobs, strict=True):
        assert {t.token: t.logprob for t in e.top_logprobs} == pytest.approx(top, abs=1e-5)
    # streamed: the chunks' entries concatenate to the non-streamed list
    text, streamed = _stream_logprobs(client, logprobs=True, top_logprobs=3, **kw)
    assert text == r.choices[0].message.content
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-6)
    assert [len(e.top_logprobs) for e in streamed] == [3] * 8
    # logprobs without top_logprobs: each token alone; without logprobs: no logprobs object
    bare = client.chat.completions.create(logprobs=True, **kw).choices[0].logprobs.content
    assert [e.top_logprobs for e in bare] == [[]] * 8
    assert [e.logprob for e in bare] == pytest.approx([e.logprob for e in content], abs=1e-6)
    assert client.chat.completions.create(**kw).choices[0].logprobs is None
    assert _stream_logprobs(client, **kw)[1] == []


def test_chat_logprobs_refusals_name_the_parameter(base_url, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=1, top_logprobs=2)
    assert e.value.param == "top_logprobs" and "logprobs" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=1, logprobs=False, top_logprobs=2)
    assert e.value.param == "top_logprobs"
    for k in (21, 1000):
        r = httpx.post(base_url + "/chat/completions", timeout=60, json={
            "model": MODEL, "messages": MSG, "max_tokens": 1, "logprobs": True, "top_logprobs": k})
        err = assert_openai_error(r, 400)
        assert err["param"] == "top_logprobs" and "20" in err["message"], err
    r = httpx.post(base_url + "/completions", timeout=60, json={"model": MODEL, "prompt": "hi", "max_tokens": 1,
                                                                "logprobs": 21})
    assert assert_openai_error(r, 400)["param"] == "logprobs"
    assert json.loads(httpx.get(base_url.removesuffix("/v1") + "/health").text)["status"] == "ok"
