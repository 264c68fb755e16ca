"""A run against an endpoint that fails (issue 19, defects 11 and 13): the API key never
reaches a file or the terminal, a later successful resume leaves no stale manifest error, and
a new run refused before its first record removes only what it created.

The endpoint is a real HTTP server on 127.0.0.1 that echoes the request's Authorization
header (`Bearer <key>`) in its error bodies (OpenAI-shaped JSON, as proxies do)."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from msa_eval.backends.base import BackendError
from msa_eval.backends.openai_backend import EndpointConfigError
from msa_eval.cli.run_setup import RunArgs, prepare
from msa_eval.runner import run_suite
from msa_eval.runner.config import ConfigError
from tests.msa_eval.conftest import msa_eval_cmd

KEY = "sk-test-" + uuid.uuid4().hex  # fresh per session: it can only appear by being echoed
REDACTED = "<redacted OPENAI_API_KEY>"


class EchoServer:
    """Answers POSTs by `modes` (popped per request, then `default`): "400", "401", "500"
    echo the Authorization header; "ok" is a non-streaming completion."""

    def __init__(self) -> None:
        self.modes: list[str] = []
        self.default = "ok"
        self.requests = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with server._lock:
                    server.requests += 1
                    mode = server.modes.pop(0) if server.modes else server.default
                auth = self.headers.get("authorization", "")
                if mode in ("400", "401", "500"):
                    status, ctype = int(mode), "application/json"
                    out = json.dumps({"error": {"message": f"invalid request (you sent Authorization: {auth})",
                                                "type": "invalid_request_error", "param": None, "code": None}}).encode()
                else:
                    status, ctype = 200, "application/json"
                    usage = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
                    if self.path.endswith("/chat/completions"):
                        choice = {"index": 0, "message": {"role": "assistant", "content": "1234"},
                                  "finish_reason": "stop"}
                        obj = "chat.completion"
                    else:
                        choice, obj = {"index": 0, "text": "1234", "finish_reason": "stop"}, "text_completion"
                    out = json.dumps({"id": "x", "object": obj, "created": 0, "model": body["model"],
                                      "choices": [choice], "usage": usage}).encode()
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        return Handler


@pytest.fixture(scope="module")
def server():
    s = EchoServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def prep(server, tmp_path_factory):
    """The plan of a 3-sample run (the reference tokenizer is loaded once for the module)."""
    return prepare(RunArgs("helmet", "openai", "m", "dense", server.base_url, None, "512", 3, "niah_single",
                           None, None, None, None, tmp_path_factory.mktemp("unused") / "r",
                           ("max_retries=0", "stream=false")))


def _cfg(prep, out: Path, **options):
    """prep's config with its cache in `out` and extra backend options."""
    return replace(prep.cfg, backends=tuple(
        replace(b, options={**b.options, "cache_dir": str(out / "cache"), **options}) for b in prep.cfg.backends))


def _files_holding(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_echoed_key_is_scrubbed_from_records_manifest_and_terminal(server, tmp_path):
    """Three requests fail with the key echoed (400, 500, 400): the run stops with one
    error line; then the endpoint recovers and the same command completes. The directory's
    name has `[` (rich markup) and the backend key `openai:m:` holds an emoji code."""
    out = tmp_path / "run[/x]"
    argv = msa_eval_cmd("run", "helmet", "--backend", "openai", "--base-url", server.base_url, "--model", "m",
                        "--tasks", "niah_single", "--lengths", "512", "--samples", "3", "--out", str(out),
                        "--backend-opt", "max_retries=0", "--backend-opt", "stream=false")
    env = {**os.environ, "COLUMNS": "200", "OPENAI_API_KEY": KEY}
    server.modes, server.default = ["400", "500", "400"], "500"
    first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert first.returncode == 2, first.stderr
    errors = [x for x in first.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "openai:m: 3 requests in a row failed" in errors[0]  # `:m:` stays text
    assert REDACTED in errors[0] and "Traceback" not in first.stderr
    assert f"run directory: {out}" in first.stderr  # `[/x]` printed literally, not parsed as markup
    assert KEY not in first.stdout + first.stderr and not _files_holding(out, KEY)
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["status"] == "error" and REDACTED in r["error"] for r in recs)
    assert {"(400)" in r["error"] or "InternalServerError" in r["error"] for r in recs} == {True}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "error" and REDACTED in manifest["error"]

    server.modes, server.default = [], "ok"
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "3 generated, 0 resumed, 0 errors" in second.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and "error" not in manifest  # no stale error
    resumed = [e for e in manifest["events"] if "resumed" in e]
    assert resumed[-1]["previous_status"] == "error" and REDACTED in resumed[-1]["previous_error"]
    assert KEY not in second.stdout + second.stderr and not _files_holding(out, KEY)


def test_rejected_key_is_scrubbed_and_the_new_run_dir_removed(server, prep, tmp_path, monkeypatch):
    """A 401 that echoes the key: EndpointConfigError, redacted; nothing was recorded, so the
    directory this run created is gone and the corrected rerun uses the same --out."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "fresh"
    server.modes, server.default = [], "401"
    with pytest.raises(EndpointConfigError) as e:
        run_suite(_cfg(prep, out), out, prep.plan, prep.reference_info, reference_tokenizer=prep.tokenizer)
    assert REDACTED in str(e.value) and KEY not in str(e.value) and e.value.__cause__ is None
    assert "the new run directory was removed" in str(e.value) and not out.exists()
    server.default = "ok"
    res = run_suite(_cfg(prep, out), out, prep.plan, prep.reference_info, reference_tokenizer=prep.tokenizer)
    assert res.generated == 3 and res.manifest["status"] == "complete"


def test_failed_validation_never_blocks_the_corrected_rerun(server, prep, tmp_path):
    """A typo'd backend option changes the config hash: the old code left a manifest that made
    the corrected command fail with "holds a run of another config"."""
    server.modes, server.default = [], "ok"
    out = tmp_path / "typo"
    with pytest.raises(BackendError, match="unknown openai backend options"):
        run_suite(_cfg(prep, out, chat_olny=True), out, prep.plan, prep.reference_info)
    assert not out.exists()
    res = run_suite(_cfg(prep, out, chat_only=True), out, prep.plan, prep.reference_info,
                    reference_tokenizer=prep.tokenizer)
    assert res.generated == 3
    empty = tmp_path / "made-by-the-user"
    empty.mkdir()
    with pytest.raises(BackendError):
        run_suite(_cfg(prep, empty, chat_olny=True), empty, prep.plan, prep.reference_info)
    assert empty.is_dir() and not any(empty.iterdir())  # the folder stays; only our manifest went


def test_an_older_run_is_never_removed(server, prep, tmp_path):
    server.modes, server.default = [], "ok"
    out = tmp_path / "older"
    first = [replace(p, samples=p.samples[:1]) for p in prep.plan]  # like --limit 1
    run_suite(_cfg(prep, out), out, first, prep.reference_info, reference_tokenizer=prep.tokenizer)
    before = (out / "records.jsonl").read_bytes()
    with pytest.raises(BackendError, match="timeout_s"):  # not part of the config hash: same run
        run_suite(_cfg(prep, out, timeout_s=-1), out, prep.plan, prep.reference_info,
                  reference_tokenizer=prep.tokenizer)
    assert (out / "records.jsonl").read_bytes() == before
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "error" and "timeout_s" in manifest["error"]


def test_concurrency_zero_is_an_error_not_the_default(tmp_path):
    with pytest.raises(ConfigError, match=r"--concurrency must be >= 1, got 0"):
        prepare(RunArgs("helmet", "openai", "m", "dense", "http://127.0.0.1:9/v1", None, "512", 1,
                        "niah_single", None, None, 0, None, tmp_path / "r"))
