"""Response cache keyed by the request hash, stored in the run directory.

The key is sha256 over the canonical JSON of (base URL, endpoint, request payload): model,
prompt or messages, tools, max_tokens, temperature, top_p, stop, seed. The API key is never
part of the key or the value. One JSON file per response under `<dir>/<key[:2]>/<key>.json`,
written atomically (`msa_common.atomic`), so an interrupted run leaves no half entries and
a rerun replays finished requests exactly (reproducible, resumable). Only successful
responses are stored.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from msa_common.atomic import atomic_write_json


def request_key(base_url: str, endpoint: str, payload: dict[str, Any]) -> str:
    canonical = json.dumps({"base_url": base_url.rstrip("/"), "endpoint": endpoint, "payload": payload},
                           sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class ResponseCache:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        p = self._path(key)
        try:
            return json.loads(p.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # unreadable entry: treat as a miss, it will be rewritten

    def put(self, key: str, value: dict[str, Any]) -> None:
        atomic_write_json(self._path(key), value, indent=None, ensure_ascii=False, default=None)
