"""Request-body size limit: refuse oversized bodies before they are read, parsed or tokenised.

The cap is derived from the context length (`default_max_body_bytes`): a request whose prompt
fits the context needs at most about `max_model_len` tokens of text or token ids, and 64 bytes
per token covers the longest text tokens, JSON escaping and several token-id prompts in one
completions request; `--max-body-bytes` overrides it. A declared `Content-Length` over the cap
is refused without reading a byte of the body; a chunked body is read only up to the cap.
The refusal is an OpenAI-shaped 413 with `Connection: close` (the unread rest of the body makes
the connection unusable).
"""
from __future__ import annotations

import json
from typing import Any

from engine.server.errors import ApiError

BODY_BYTES_PER_TOKEN = 64
BODY_OVERHEAD_BYTES = 256 * 1024  # system prompt, tool specs, sampling fields


def default_max_body_bytes(max_model_len: int) -> int:
    return BODY_BYTES_PER_TOKEN * max_model_len + BODY_OVERHEAD_BYTES


def _declared_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """Pure ASGI middleware: buffer each HTTP request body up to `max_bytes`, refuse anything larger.

    The body is handed to the app as one message, so the app never sees a partial body; later
    `receive()` calls (disconnect polling) go to the server unchanged.
    """

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, f"{declared} bytes declared")
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending its body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, f"more than {self.max_bytes} bytes sent")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = [False]

        async def replay() -> dict:
            if not replayed[0]:
                replayed[0] = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any, seen: str) -> None:
        message = (f"request body too large ({seen}); this server accepts at most {self.max_bytes} bytes "
                   f"(derived from its context length); send a shorter request or restart the server with a "
                   f"larger --max-body-bytes")
        payload = json.dumps(ApiError(413, message, code="request_too_large").body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})
