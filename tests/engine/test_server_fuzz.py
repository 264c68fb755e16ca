"""The standing adversarial suite: property-based fuzzing of the HTTP API from its own OpenAPI schema.

A real `msa-eval serve` subprocess (default model, dense, CPU, --max-model-len 512, capacity 8)
is fuzzed with schemathesis: for every operation in its /openapi.json, schema-valid bodies
(positive mode) and schema-violating ones (negative mode), plus raw bytes posted as JSON. Each
response must be < 500; every 4xx (and any in-band stream error) OpenAI-shaped. Afterwards the
server must still give the same greedy answer as before the fuzzing.

Bounded for CI: hypothesis is derandomized (the same bodies every run), EXAMPLES cases per
operation and mode, `max_tokens` clamped to 2 and `model` set to the served name in generated
bodies (so they reach generation instead of stopping at 404). The counts (bodies per route,
status histogram, 5xx seen) are printed in pytest's terminal summary.
"""
from __future__ import annotations

import collections
import json

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402 - after the importorskip
from hypothesis import strategies as st  # noqa: E402 - after the importorskip

from tests.engine.openai_shape import assert_openai_error  # noqa: E402 - after the importorskip
from tests.engine.serve_process import running_server  # noqa: E402 - after the importorskip

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 512
EXAMPLES = 40  # per operation and generation mode
RAW_EXAMPLES = 25  # raw byte bodies per POST route
MAX_NEW = 2
GREEDY = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours of the rainbow."}],
          "temperature": 0, "max_tokens": 12}

_stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_slowest: list[tuple[float, str, str]] = []  # (seconds, route, body) of the slowest requests, for the summary
_failures: list[str] = []


class _Summary:
    """Prints the fuzzing counts in pytest's terminal summary (shown without -s, as CI runs it)."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _stats:
            return
        tr = terminalreporter
        tr.section("HTTP fuzz counts (schemathesis, derandomized)")
        total = fives = 0
        for route, hist in sorted(_stats.items()):
            n = sum(hist.values())
            total += n
            fives += sum(v for k, v in hist.items() if k >= 500)
            tr.write_line(f"{route}: {n} bodies, statuses " + ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())))
        tr.write_line(f"total {total} bodies tried, 5xx seen: {fives}")
        for dt, route, body in sorted(_slowest, reverse=True)[:3]:
            tr.write_line(f"slow: {dt:.1f} s {route} {body[:200]}")


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    pm = request.config.pluginmanager
    if pm.get_plugin("msa-http-fuzz-summary") is None:
        pm.register(_Summary(), name="msa-http-fuzz-summary")
    yield


@pytest.fixture(scope="module")
def server():
    with running_server("--max-model-len", str(MAX_MODEL_LEN), "--max-batch", "4", "--max-queue", "4") as url:
        root = url.removesuffix("/v1")
        before = httpx.post(url + "/chat/completions", json=GREEDY, timeout=120)
        assert before.status_code == 200, before.text
        yield root, before.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(server[0] + "/openapi.json")


def _operations() -> list[tuple[str, str]]:
    return [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/responses"),
            ("GET", "/v1/responses/{response_id}"), ("POST", "/tokenize"),
            ("POST", "/detokenize"), ("GET", "/v1/models"), ("GET", "/v1/models/{model}"), ("GET", "/tokenizer_info"),
            ("GET", "/health"), ("GET", "/metrics")]


_UNSUPPORTED = ("n", "presence_penalty", "frequency_penalty", "logit_bias", "suffix", "response_format", "top_logprobs")
VOCAB = 49152


def _bounded(path: str, body, positive: bool):
    """Keep generation short: small max_tokens, the served model name (so bodies get past the 404). Schema-valid
    bodies also lose the fields the server refuses by design (n > 1, penalties, ...) and keep token ids inside the
    vocabulary, so that they reach generation; negative and raw bodies cover those refusals."""
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    if positive:
        for key in _UNSUPPORTED:
            body.pop(key, None)
        if path == "/v1/completions" and isinstance(body.get("prompt"), list):
            body["prompt"] = [[abs(t) % VOCAB for t in x] if isinstance(x, list) else
                              abs(x) % VOCAB if isinstance(x, int) else x for x in body["prompt"]]
    if path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        keys = [k for k in ("max_tokens", "max_completion_tokens", "max_output_tokens") if k in body]
        for k in keys:
            v = body[k]
            if v is None or (isinstance(v, int) and not isinstance(v, bool) and MAX_NEW < v <= MAX_MODEL_LEN):
                body[k] = MAX_NEW  # null means the rest of the context; larger than it stays: a quick 400
        if not keys:
            body["max_output_tokens" if path == "/v1/responses" else "max_tokens"] = MAX_NEW
    return body


def _check(route: str, status: int, content_type: str, text: str, sent: object, seconds: float) -> None:
    _stats[route][status] += 1
    _slowest.append((seconds, route, str(sent)))
    _slowest[:] = sorted(_slowest, reverse=True)[:3]
    assert status < 500, f"{route} answered {status} to {str(sent)[:300]}: {text[:500]}"
    if status >= 400:
        try:
            assert_openai_error(json.loads(text))
        except (AssertionError, ValueError) as e:
            raise AssertionError(f"{route} answered {status} to {str(sent)[:300]} with {text[:300]}") from e
    elif content_type.startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data: {") and '"error"' in line[:20]:
                err = assert_openai_error(json.loads(line[6:]))
                assert err["type"] != "server_error", f"{route} streamed a server error: {err}"


_SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                     phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck),
                     print_blob=False)


@pytest.mark.parametrize("method, path", _operations(), ids=[f"{m} {p}" for m, p in _operations()])
def test_schema_fuzz_never_5xx(schema, method, path):
    op = schema[path][method]
    modes = [schemathesis.GenerationMode.POSITIVE]
    if method == "POST":
        modes.append(schemathesis.GenerationMode.NEGATIVE)
    route = f"{method} {path}"
    import requests

    with requests.Session() as session:
        for mode in modes:
            @_SETTINGS
            @given(case=op.as_strategy(generation_mode=mode))
            def fuzz(case):
                if method == "POST":
                    positive = mode == schemathesis.GenerationMode.POSITIVE  # noqa: B023 - fuzz() runs in this turn
                    case.body = _bounded(path, case.body, positive)
                r = case.call(session=session, timeout=120)
                _check(route, r.status_code, (r.headers.get("content-type") or [""])[0],
                       r.content.decode("utf-8", "replace"), case.body, r.elapsed)

            fuzz()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize",
                                  "/detokenize"])
def test_raw_bytes_never_5xx(server, path):
    root = server[0]
    with httpx.Client(base_url=root, timeout=120) as client:
        @settings(max_examples=RAW_EXAMPLES, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(body=st.one_of(st.binary(max_size=300), st.text(max_size=200).map(str.encode),
                              st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c,
                                                                                                 max_size=3),
                                           max_leaves=10).map(lambda v: json.dumps(v).encode())))
        def fuzz(body: bytes):
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            _check(f"POST {path} (raw)", r.status_code, r.headers.get("content-type", ""), r.text, body,
                   r.elapsed.total_seconds())

        fuzz()


def test_server_answers_the_same_after_fuzzing(server):
    root, before = server
    after = httpx.post(root + "/v1/chat/completions", json=GREEDY, timeout=120)
    assert after.status_code == 200, after.text
    assert after.json()["choices"][0]["message"]["content"] == before
    assert httpx.get(root + "/health", timeout=30).json()["status"] == "ok"

