"""HTTP errors in the OpenAI error JSON shape: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import json

from fastapi.responses import Response

from engine.server.schemas import ErrorBody, ErrorResponse

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 500: "server_error",
          503: "service_unavailable"}


class ApiError(Exception):
    """An error answered to the client; `message` is one line that names the limit or the fix."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "invalid_request_error")
        return ErrorResponse(error=ErrorBody(message=self.message, type=kind, param=self.param,
                                             code=self.code)).model_dump()

    def response(self) -> Response:
        # ASCII-escaped JSON: a message quoting client text can never fail to encode
        return Response(json.dumps(self.body()), status_code=self.status, headers=self.headers or None,
                        media_type="application/json")
