"""A request's state inside the engine."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.sampling import SamplingParams

LogprobRow = tuple[float | None, dict[int, float]]  # (log p(token), {alternative id: log p}); None: no context


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_len: int  # prompt + generated tokens may not exceed this (context limit)
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    finished: bool = False
    finish_reason: str | None = None
    text_len_checked: int = 0
    generator: torch.Generator | None = None
    arrival: float = field(default_factory=time.perf_counter)
    first_scheduled: float | None = None
    first_token: float | None = None
    finish_time: float | None = None
    keys_read: float = 0.0  # MSA statistics accumulated over layers and steps
    keys_dense: float = 0.0
    prompt_logprobs: list[LogprobRow] | None = None  # with params.prompt_logprobs: filled chunk by chunk
    output_logprobs: list[LogprobRow] = field(default_factory=list)  # with params.logprobs: one per token
    error: Exception | None = None  # why the request ended with finish_reason "error"
    telemetry: Any = None  # engine.msa.telemetry.SelectionTelemetry when the engine measures MSA's selection
    grammar: Any = None  # engine.constrained.GrammarState with params.constraint: advanced with every token

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [(None, {})]  # the first token has no context

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def pending(self) -> int:
        """Tokens not yet in the cache (the whole prompt at first, then 1 per decode step)."""
        return self.total_len - self.num_computed

    def metrics(self) -> dict[str, Any]:
        """Timings (s), `attention_density` (MSA) and, with selection telemetry, `msa_telemetry` (a dict)."""
        m: dict[str, Any] = {
            "queue_s": (self.first_scheduled - self.arrival) if self.first_scheduled else None,
            "prefill_s": ((self.first_token - self.first_scheduled) if self.first_token and self.first_scheduled
                          else None),
            "ttft_s": (self.first_token - self.arrival) if self.first_token else None,
            "decode_s": (self.finish_time - self.first_token) if self.finish_time and self.first_token else None,
        }
        if self.keys_dense:
            m["attention_density"] = self.keys_read / self.keys_dense
        if self.telemetry is not None:
            m["msa_telemetry"] = self.telemetry.summary()
        return m
