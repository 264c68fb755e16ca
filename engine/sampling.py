"""Sampling parameters and the sampler (greedy, temperature, top-k, top-p, per-request seed).

A temperature so small that `logits / temperature` overflows float32 samples greedily: the
limit of softmax(logits / T) as T -> 0 is the argmax, and the overflowed division would give
inf - inf = NaN probabilities instead. Above that threshold the distribution is sampled as
asked (at T = 1e-30 it is already one-hot in float32, so the draw is the argmax anyway).
Logits holding NaN or inf (a model fault, never a request's) raise `SamplingError`.
A request with a `constraint` (`engine.constrained`) draws only among the tokens its grammar allows: the
mask is applied after the finiteness check (masked logits are -inf on purpose), before temperature,
top-k and top-p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.constrained import JsonConstraint


class SamplingError(ValueError):
    """One request's token could not be drawn (its row of logits is not finite)."""


@dataclass
class SamplingParams:
    max_tokens: int = 64  # 0 only with prompt_logprobs: score the prompt, generate nothing
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # per generated token: its log-prob and this many top alternatives
    prompt_logprobs: int | None = None  # per prompt token (after the first): the same, computed during prefill
    constraint: JsonConstraint | None = None  # the output must match this grammar (engine.constrained)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and n < 0:
                raise ValueError(f"{name} must be >= 0 (None = off), got {n}")
        if self.max_tokens < 0 or (self.max_tokens == 0 and self.prompt_logprobs is None):
            raise ValueError(f"max_tokens must be >= 1 (0 only with prompt_logprobs, to score a prompt), "
                             f"got {self.max_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a list of strings, got {self.stop!r}")
        if self.constraint is not None and not isinstance(self.constraint, JsonConstraint):
            raise ValueError(f"constraint must be an engine.constrained.JsonConstraint, got {self.constraint!r}")


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
           allowed: torch.Tensor | None = None) -> int:
    """One token from `logits` `[vocab]` (float32); `allowed` `[vocab]` bool: draw only among these."""
    if not bool(torch.isfinite(logits).all()):
        raise SamplingError("the model's logits for this request hold NaN or inf: no token can be drawn")
    if allowed is not None and not bool(allowed.any()):
        raise SamplingError("the request's grammar allows no next token")
    masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    if params.temperature == 0.0:
        return int(torch.argmax(masked).item())
    x = logits / params.temperature
    if not bool(torch.isfinite(x).all()):  # the temperature is below float32's range for these logits: greedy
        return int(torch.argmax(masked).item())
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    if params.top_k > 0:
        kth = torch.topk(x, min(params.top_k, x.numel())).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < params.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator).item())
