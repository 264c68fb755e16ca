"""A local OpenAI-compatible HTTP server that answers from a script (for the adapter's tests).

`ScriptedOpenAI(script=[429, 500])` answers the first requests with those error statuses,
then succeeds; it records every request (path, JSON body, headers) and the peak number of
requests in flight. Successful answers are real OpenAI wire format: JSON, or server-sent
events when the request says `stream`, with usage. Standard library only.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedOpenAI:
    def __init__(self, script: list[int] | None = None, default_status: int = 200, delay_s: float = 0.0,
                 text: str = "Hello from the scripted server", tool_call: dict[str, Any] | None = None,
                 error_message: str | None = None) -> None:
        self.script, self.default_status, self.delay_s = list(script or []), default_status, delay_s
        self.text, self.tool_call, self.error_message = text, tool_call, error_message
        self.requests: list[dict[str, Any]] = []
        self.inflight = self.max_inflight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next_status(self) -> int:
        with self._lock:
            return self.script.pop(0) if self.script else self.default_status

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                if status == 429:
                    self.send_header("retry-after", "0")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with server._lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    server.requests.append({"path": self.path, "body": body, "headers": headers})
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                try:
                    status = server._next_status()
                    time.sleep(server.delay_s)
                    if status != 200:
                        msg = server.error_message or f"scripted failure {status}"
                        self._send(status, json.dumps({"error": {"message": msg, "type": "scripted", "param": None,
                                                                 "code": None}}).encode())
                    elif body.get("stream"):
                        events = "".join(f"data: {json.dumps(e)}\n\n" for e in server._events(self.path, body))
                        self._send(200, events.encode() + b"data: [DONE]\n\n", "text/event-stream")
                    else:
                        self._send(200, json.dumps(server._response(self.path, body)).encode())
                finally:
                    with server._lock:
                        server.inflight -= 1

        return Handler

    def _usage(self) -> dict[str, int]:
        n = len(self.text.split())
        return {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}

    def _response(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        base = {"id": "x-1", "created": 0, "model": body["model"], "usage": self._usage()}
        if path.endswith("/chat/completions"):
            message: dict[str, Any] = {"role": "assistant", "content": self.text}
            if self.tool_call:
                message = {"role": "assistant", "content": None, "tool_calls": [self.tool_call]}
            return {**base, "object": "chat.completion",
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "tool_calls" if self.tool_call else "stop"}]}
        return {**base, "object": "text_completion",
                "choices": [{"index": 0, "text": self.text, "finish_reason": "stop"}]}

    def _events(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        words = self.text.split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        base = {"id": "x-1", "created": 0, "model": body["model"]}
        if path.endswith("/chat/completions"):
            kind = "chat.completion.chunk"
            if self.tool_call:
                fn = self.tool_call["function"]
                half = len(fn["arguments"]) // 2
                deltas = [{"tool_calls": [{"index": 0, "id": self.tool_call["id"], "type": "function",
                                           "function": {"name": fn["name"], "arguments": fn["arguments"][:half]}}]},
                          {"tool_calls": [{"index": 0, "function": {"arguments": fn["arguments"][half:]}}]}]
            else:
                deltas = [{"role": "assistant", "content": ""}] + [{"content": p} for p in pieces]
            choices = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
            final = {"index": 0, "delta": {}, "finish_reason": "tool_calls" if self.tool_call else "stop"}
        else:
            kind = "text_completion"
            choices = [{"index": 0, "text": p, "finish_reason": None} for p in pieces]
            final = {"index": 0, "text": "", "finish_reason": "stop"}
        events = [{**base, "object": kind, "choices": [c]} for c in choices + [final]]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "object": kind, "choices": [], "usage": self._usage()})
        return events
