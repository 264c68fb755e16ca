"""The assertion every adversarial server test shares: a response body is an OpenAI-shaped error."""
from __future__ import annotations

import httpx


def assert_openai_error(r: httpx.Response | dict, status: int | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}}` with a one-line message; returns the inner object."""
    body = r if isinstance(r, dict) else r.json()
    if status is not None:
        assert r.status_code == status, r.text
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and "\n" not in err["message"]
    assert isinstance(err["type"], str) and err["type"]
    return err
