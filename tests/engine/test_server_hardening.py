"""Hand-written adversarial cases for the HTTP edge (issue 19, defects 2, 7, 8, 9 and part of 13).

One real `msa-eval serve` subprocess (default model, dense, CPU, --max-model-len 2048, capacity
3 = --max-batch 2 --max-queue 1) driven over 127.0.0.1 with httpx and raw sockets. Every refusal
must be OpenAI-shaped ({"error": {"message", "type", "param", "code"}}), carry a message that
names the limit or the fix, and leave the server (and a kept-alive connection) serving.
"""
from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from pathlib import Path

import httpx
import pytest

from engine.server.bodylimit import default_max_body_bytes
from engine.server.jsonguard import MAX_JSON_DEPTH
from engine.server.schemas import ChatCompletionRequest
from tests.engine.openai_shape import assert_openai_error
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
MAX_MODEL_LEN = 2048
CAPACITY = 3
BODY_LIMIT = default_max_body_bytes(MAX_MODEL_LEN)
MSG = [{"role": "user", "content": "hi"}]
SHORT = {"model": MODEL, "max_tokens": 1}  # an old server that accepted the case answers at once
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def base_url():
    with running_server("--max-model-len", str(MAX_MODEL_LEN), "--max-batch", "2", "--max-queue", "1") as url:
        yield url


@pytest.fixture(scope="module")
def root(base_url):
    return base_url.removesuffix("/v1")


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _server_pid(port: int) -> int:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                args = (d / "cmdline").read_bytes().split(b"\0")
                if b"serve" in args and b"--port" in args and args[args.index(b"--port") + 1] == str(port).encode():
                    return int(d.name)
    raise AssertionError(f"no server process on port {port}")


def _rss_mb(pid: int) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _deep_tools(levels: int) -> bytes:
    """A chat request whose one tool's `parameters` nests `levels` objects deep (JSON text: json.dumps would
    recurse)."""
    k = levels // 2
    params = '{"type": "object", "properties": {"x": ' * k + "{}" + "}}" * k
    return ('{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}], '
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": ' + params + "}}]}").encode()


def _raw_json(obj_text: str) -> bytes:
    return obj_text.encode()


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# (id, method, path, body: dict -> JSON, bytes -> sent as is, status, param (or a tuple of accepted ones),
#  words the message must contain)
CASES = [
    # defect 7: client errors that were 500s
    ("lone-surrogate-chat", "POST", CHAT,
     _raw_json('{"model": "smollm2-135m", "messages": [{"role": "user", "content": "a\\ud800b"}]}'),
     400, "messages", ["surrogate", "messages.0.content", "valid UTF-8"]),
    ("lone-surrogate-completions", "POST", COMPLETIONS, _raw_json('{"model": "smollm2-135m", "prompt": "x\\udfff"}'),
     400, "prompt", ["surrogate", "valid UTF-8"]),
    ("lone-surrogate-tokenize", "POST", "/tokenize", _raw_json('{"prompt": "\\ud83d"}'), 400, "prompt", ["surrogate"]),
    # 954 levels: the old server parsed it, then json.dumps hit the recursion limit (a narrow window: 958 failed
    # to parse)
    # (here the parser or the depth guard refuses it, depending on the stack depth: either is a 400 naming the limit)
    ("tool-parameters-954-deep", "POST", CHAT, _deep_tools(954), 400, ("tools", None),
     [f"at most {MAX_JSON_DEPTH} levels of arrays and objects"]),
    ("tool-parameters-100-deep", "POST", CHAT, _deep_tools(100), 400, "tools",
     [f"more than {MAX_JSON_DEPTH} levels", "flatten"]),
    ("seed-above-int64", "POST", CHAT, {"model": MODEL, "messages": MSG, "seed": 2**70, "max_tokens": 1}, 400, "seed",
     ["seed", "less than 9223372036854775808"]),
    ("seed-below-int64", "POST", COMPLETIONS, {"model": MODEL, "prompt": "a", "seed": -2**64, "max_tokens": 1}, 400,
     "seed", ["seed", "greater than or equal to -9223372036854775808"]),
    # defect 8: framework errors in the OpenAI shape
    ("non-utf8-body", "POST", CHAT, b'{"model": "\xff\xfe\xfa", "messages": []}', 400, None,
     ["not UTF-8", "UTF-8 JSON"]),
    ("binary-junk", "POST", CHAT, bytes(range(256)) * 4, 400, None, ["JSON"]),
    ("nested-5000-deep", "POST", CHAT, b'{"model": "m", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None,
     ["nested too deeply", f"at most {MAX_JSON_DEPTH} levels"]),
    ("unknown-route", "POST", "/v1/chat/complete", {"model": MODEL}, 404, None, ["no route", "/v1/chat/completions"]),
    ("unknown-root-route", "GET", "/nope", None, 404, None, ["no route GET /nope"]),
    ("wrong-method-chat", "GET", CHAT, None, 405, None, ["method GET is not allowed", "use POST"]),
    ("wrong-method-health", "DELETE", "/health", None, 405, None, ["use GET"]),
    # defect 9: a request that can never be admitted is a 400, not a 429
    ("more-prompts-than-capacity", "POST", COMPLETIONS,
     {"model": MODEL, "prompt": ["a"] * (CAPACITY + 1), "max_tokens": 1}, 400, "prompt",
     [f"{CAPACITY + 1} prompts", f"at most {CAPACITY}", "--max-queue"]),
    ("more-id-prompts-than-capacity", "POST", COMPLETIONS, {"model": MODEL, "prompt": [[1, 2]] * 50, "max_tokens": 1},
     400, "prompt", ["50 prompts"]),
    # defect 13: lenient acceptance where OpenAI answers 400
    ("max-tokens-string", "POST", CHAT, {"model": MODEL, "messages": MSG, "max_tokens": "5"}, 400, "max_tokens",
     ["max_tokens", "valid integer"]),
    ("stream-string", "POST", CHAT, {**SHORT, "messages": MSG, "stream": "yes"}, 400, "stream",
     ["stream", "valid boolean"]),
    ("echo-int", "POST", COMPLETIONS, {**SHORT, "prompt": "a", "echo": 1}, 400, "echo", ["echo", "valid boolean"]),
    ("tool-choice-without-tools", "POST", CHAT,
     {**SHORT, "messages": MSG, "tool_choice": {"type": "function", "function": {"name": "f"}}}, 400, "tool_choice",
     ["'f'", "no tools are given", "add it to tools"]),
    ("tool-choice-not-among-tools", "POST", CHAT,
     {**SHORT, "messages": MSG, "tools": [TOOL_F], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     400, "tool_choice", ["'g'", "not among tools ['f']"]),
    ("tool-choice-required-without-tools", "POST", CHAT, {**SHORT, "messages": MSG, "tool_choice": "required"},
     400, "tool_choice", ["needs tools"]),
    ("tool-message-without-call", "POST", CHAT,
     {**SHORT, "messages": [*MSG, {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]}, 400, "messages",
     ["messages[1]", "does not follow an assistant message with tool_calls"]),
    ("tool-message-after-user-turn", "POST", CHAT,
     {**SHORT, "messages": [*MSG, CALL, *MSG, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}, 400,
     "messages", ["messages[3]"]),
    ("tool-message-unknown-call-id", "POST", CHAT,
     {**SHORT, "messages": [*MSG, CALL, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}, 400,
     "messages", ["'call_9'", "matches no tool call", "['call_1']"]),
    ("top-logprobs-without-logprobs", "POST", CHAT, {**SHORT, "messages": MSG, "top_logprobs": 3}, 400,
     "top_logprobs", ["needs logprobs: true"]),
    # defect 2: text that cannot fit the context is refused before it is tokenised
    ("prompt-chars-beyond-context", "POST", COMPLETIONS, {**SHORT, "prompt": "ab" * (BODY_LIMIT // 2 - 2000)},
     400, "prompt", ["2048 tokens", "characters", "shorten the prompt"]),
]


@pytest.mark.parametrize("name, method, path, body, status, param, needles", CASES, ids=[c[0] for c in CASES])
def test_adversarial_request_is_a_clear_openai_error(root, name, method, path, body, status, param, needles):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"} if content is not None else {}
    r = httpx.request(method, root + path, content=content, headers=headers, timeout=120)
    err = assert_openai_error(r, status)
    assert err["param"] in (param if isinstance(param, tuple) else (param,)), err
    for needle in needles:
        assert needle in err["message"], (needle, err["message"])


def test_tool_results_after_their_call_are_still_accepted(base_url):
    messages = [*MSG, {**CALL, "tool_calls": CALL["tool_calls"] * 1},
                {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}, {"role": "tool", "content": "no id"}]
    r = httpx.post(base_url + "/chat/completions", json={"model": MODEL, "messages": messages, "tools": [TOOL_F],
                                                         "temperature": 0, "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text


def test_tiny_temperature_stays_valid_in_the_schema():
    """1e-40 is the sampler's business (another fix of issue 19): the edge must not refuse it."""
    req = ChatCompletionRequest.model_validate({"model": MODEL, "messages": MSG, "temperature": 1e-40,
                                                "seed": 2**63 - 1})
    assert req.temperature == 1e-40 and req.seed == 2**63 - 1


@pytest.mark.parametrize("bad", [
    b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\\ud800"}]}',
    _deep_tools(954),
    json.dumps({"model": MODEL, "messages": MSG, "seed": 2**64, "max_tokens": 1}).encode(),
], ids=["surrogate", "deep-parameters", "seed"])
def test_client_error_keeps_the_connection_alive(base_url, bad):
    """A 400 on a kept-alive connection: the same httpx.Client's next request reuses that connection."""
    with httpx.Client(base_url=base_url, timeout=120) as client:
        before = client.get("/models")
        local = before.extensions["network_stream"].get_extra_info("client_addr")
        r = client.post("/chat/completions", content=bad, headers={"content-type": "application/json"})
        assert_openai_error(r, 400)
        assert r.headers.get("connection", "").lower() != "close"
        ok = client.post("/chat/completions", json={"model": MODEL, "messages": MSG, "temperature": 0, "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None
        assert ok.extensions["network_stream"].get_extra_info("client_addr") == local  # same connection


def _recv_response(sock: socket.socket, timeout: float = 60.0) -> tuple[int, dict, dict]:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(rest) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest)


def _head(path: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}\r\n").encode()


def test_huge_declared_body_is_refused_before_it_is_sent(base_url):
    """Content-Length: 16 MB and not one body byte sent: the 413 comes back at once (the old server waited)."""
    port = _port(base_url)
    rss_before = _rss_mb(_server_pid(port))
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(_head("/v1/chat/completions", f"Content-Length: {16 << 20}\r\n"))
        status, headers, body = _recv_response(s, timeout=30)
    assert status == 413 and headers["connection"] == "close"
    err = assert_openai_error(body)
    assert f"at most {BODY_LIMIT} bytes" in err["message"] and "--max-body-bytes" in err["message"]
    assert err["code"] == "request_too_large"
    assert _rss_mb(_server_pid(port)) - rss_before < 50


def test_huge_chunked_body_is_refused_while_it_is_read_and_health_answers(base_url, root):
    """A chunked 16 MB body: the 413 arrives long before the client has sent it all, /health answers meanwhile,
    and the server's memory does not grow by the body (the old server read all 16 MB, then tokenised it)."""
    port = _port(base_url)
    pid = _server_pid(port)
    rss_before = _rss_mb(pid)
    piece = b'"' + b"word " * 13107 + b'", '  # ~64 KiB of JSON text per chunk
    total, sent, status = 16 << 20, 0, None
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(_head("/v1/chat/completions", "Transfer-Encoding: chunked\r\n"))
        s.sendall(b"%x\r\n%s\r\n" % (len(b'{"model": "smollm2-135m", "messages": ['),
                                     b'{"model": "smollm2-135m", "messages": ['))
        health_during = None
        while sent < total:
            readable, _, _ = select.select([s], [], [], 0)
            if readable:
                break
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
            if health_during is None and sent > BODY_LIMIT // 2:  # mid-upload, before the limit is crossed
                health_during = httpx.get(root + "/health", timeout=30).status_code
        status, headers, body = _recv_response(s)
    assert health_during == 200
    assert status == 413, body
    assert_openai_error(body)
    assert sent < total // 2, f"the server read {sent} of {total} bytes before refusing"
    assert httpx.get(root + "/health", timeout=30).status_code == 200
    assert _rss_mb(pid) - rss_before < 100


def test_health_answers_while_long_prompts_are_tokenised(base_url, root):
    """Prompts just under the character pre-check are tokenised in worker threads: /health, sent after them,
    is answered before the last of them is (the old server tokenised on the event loop, so /health waited behind
    all four; on a loaded 2-core machine one worker thread can finish before /health is served)."""
    text = "word " * 33000  # 165,000 characters: under 2048 x 81, about 33,000 tokens, so refused after tokenising
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()
    assert len(body) < BODY_LIMIT
    socks = []
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", _port(base_url)))
            s.sendall(_head("/v1/chat/completions", f"Content-Length: {len(body)}\r\n") + body)
            socks.append(s)
        time.sleep(0.05)  # the bodies are on the wire before /health is asked
        assert httpx.get(root + "/health", timeout=60).status_code == 200
        ready, _, _ = select.select(socks, [], [], 0)
        assert len(ready) < len(socks), f"{len(ready)} of 4 long prompts were answered before /health"
        for s in socks:
            status, _, err = _recv_response(s, timeout=120)
            assert status == 400 and assert_openai_error(err)["code"] == "context_length_exceeded"
    finally:
        for s in socks:
            s.close()


def test_429_carries_retry_after(base_url):
    """Capacity 3 held by three long streams: the fourth request gets 429 with Retry-After, then all recovers."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long essay."}], "max_tokens": 1000,
            "temperature": 0, "stream": True, "ignore_eos": True}
    with contextlib.ExitStack() as stack:
        for _ in range(CAPACITY):
            r = stack.enter_context(httpx.stream("POST", base_url + "/chat/completions", json=body, timeout=60))
            assert r.status_code == 200
        full = httpx.post(base_url + "/chat/completions", json={"model": MODEL, "messages": MSG, "max_tokens": 1},
                          timeout=60)
        err = assert_openai_error(full, 429)
        assert full.headers["retry-after"] == "1" and err["code"] == "queue_full" and "--max-queue" in err["message"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ok = httpx.post(base_url + "/chat/completions",
                        json={"model": MODEL, "messages": MSG, "temperature": 0, "max_tokens": 2}, timeout=60)
        if ok.status_code == 200:
            break
        time.sleep(0.2)
    assert ok.status_code == 200, ok.text
