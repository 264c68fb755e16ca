"""Scrub a credential's value from error text before anything stores or prints it.

Some endpoints echo the request (its `Authorization: Bearer <key>` header included) in their
error bodies; those bodies become GenResult.error (records.jsonl), the manifest's "error" and
the CLI's error line. The openai backend passes every error message through `redact` once,
where it turns a provider exception into a BackendError. Limits: only the exact value is
replaced (not a provider's own masked or re-encoded form of it), and values shorter than
MIN_SECRET_CHARS are left alone (scrubbing them would erase ordinary words).
"""
from __future__ import annotations

MIN_SECRET_CHARS = 8


def redact(text: str, secret: str | None, label: str = "API key") -> str:
    """`text` with every occurrence of `secret` replaced by `<redacted LABEL>`."""
    if not secret or len(secret) < MIN_SECRET_CHARS:
        return text
    return text.replace(secret, f"<redacted {label}>")
