"""Typed agent configuration, exit statuses and the per-run result."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# One status per way a run ends (submitted is the only "normal" end).
EXIT_STATUSES = ("submitted", "step_limit", "token_limit", "context_overflow", "cost_limit",
                 "wall_time_limit", "format_errors", "environment_error", "api_error")
TERMINAL_STATUSES = EXIT_STATUSES  # every status above is final; a missing result line is not


@dataclass
class AgentLimits:
    max_steps: int = 50  # model calls
    max_total_tokens: int | None = None  # summed prompt + completion tokens
    max_cost_usd: float | None = None
    max_wall_s: float | None = None
    context_window: int = 131_072  # tokens the model accepts; the view must fit
    max_consecutive_format_errors: int = 3
    max_output_tokens: int = 1024  # per model call
    command_timeout_s: float = 60.0
    max_observation_chars: int = 20_000

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentLimits:
        known = {f.name for f in fields(cls)}
        bad = set(d) - known
        if bad:
            raise ValueError(f"unknown agent limit(s) {sorted(bad)}; known: {sorted(known)}")
        return cls(**d)


@dataclass
class AgentConfig:
    limits: AgentLimits = field(default_factory=AgentLimits)
    context_policy: str = "none"  # none | truncate-observations | summarize
    tool_mode: str = "native"  # native | text
    temperature: float = 0.0
    seed: int | None = 0
    explicit_limits: tuple[str, ...] = ()  # set by the user: a task's own limits do not override these

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class AgentResult:
    task_id: str
    family: str
    status: str
    score: float
    grade: dict[str, Any]
    steps: int
    tool_calls: int
    format_errors: int
    prompt_tokens: int  # summed over calls
    completion_tokens: int
    peak_context_tokens: int
    trajectory_tokens: int  # the full history at the end
    cost_usd: float
    wall_s: float
    policy_events: int
    answer: str | None
    trajectory: str
    token_counting: str
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
