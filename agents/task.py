"""An agent task: instruction, family-specific spec (source files, setup, gold, verifier data),
limits (a task property, fixed for comparisons) and knobs, with a content hash.

Tasks are JSON-ready so a generated suite is cached as JSONL and audited; the hash changes
whenever the instruction, the spec (which pins source-file SHA-256s) or the limits change.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AgentTask:
    id: str  # "<family>-<source>-<short hash>", unique within a suite
    family: str  # "regression" | "needle" | "rename" | "ledger" (older tasks: the letters A-D)
    version: str  # family generator version
    seed: int
    instruction: str
    spec: dict[str, Any]  # family-specific; includes "gold" (oracle actions) and verifier data
    limits: dict[str, Any] = field(default_factory=dict)  # max_steps, max_context_tokens, ...
    knobs: dict[str, Any] = field(default_factory=dict)  # K, T, depth, n_entities, ... (for reports)

    def content_hash(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentTask:
        return cls(**d)

    @property
    def gold(self) -> list[dict[str, Any]]:
        """The oracle's actions: [{"name": tool, "arguments": {...}}, ...], ending with submit."""
        return self.spec["gold"]
