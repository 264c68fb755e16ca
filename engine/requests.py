"""What goes into the engine and what comes out of it: a `Request` (id, prompt token ids, sampling
params; `check_prompt` is what the engine accepts), a `StepOutput` per request and step (its new
tokens), and a `RequestOutput` once it has finished (`LLMEngine.finish`: the token ids, the text cut
before a stop string, metrics, log-probs)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from engine.errors import ContextTooLongError
from engine.sampling import SamplingParams
from engine.scoring import LogprobRow
from engine.sequence import Sequence
from engine.textstream import IncrementalText


class Request(NamedTuple):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


def check_length(n: int, params: SamplingParams, max_model_len: int) -> None:
    """ContextTooLongError when a prompt of `n` tokens (plus one generated token, if any) exceeds the context."""
    if n + (params.max_tokens > 0) > max_model_len:
        room = " (room for at least one generated token is needed)" if params.max_tokens else ""
        raise ContextTooLongError(
            f"prompt has {n} tokens but the model's context is {max_model_len}{room}: shorten the prompt",
            limit=max_model_len, length=n)


def check_prompt(ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int) -> None:
    """ValueError for an empty prompt or ids outside the vocabulary (the shared forward would fail on
    them), ContextTooLongError for one the context cannot hold."""
    if not ids:
        raise ValueError("empty prompt: give at least one token")
    if not 0 <= min(ids) <= max(ids) < vocab_size:
        raise ValueError(f"prompt token ids must lie in 0..{vocab_size - 1}, got {min(ids)}..{max(ids)}: "
                         "encode the prompt with this model's tokenizer")
    check_length(len(ids), params, max_model_len)


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # with finish_reason "error": what went wrong, one line
    logprobs: list[LogprobRow] | None = None  # the new tokens' rows (params.logprobs)
    prompt_logprobs: list[LogprobRow] | None = None  # on the request's first output (params.prompt_logprobs)


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    metrics: dict[str, Any] = field(default_factory=dict)
    logprobs: list[LogprobRow] | None = None  # per generated token (SamplingParams.logprobs)
    prompt_logprobs: list[LogprobRow] | None = None  # per prompt token, the first (None, {}) (prompt_logprobs)


def step_output(seq: Sequence, new: list[int]) -> StepOutput:
    """What one step produced for `seq`: its new tokens (their log-prob rows) and, on the output that
    ends the prefill, the prompt's rows."""
    first = len(seq.output_ids) == len(new)
    return StepOutput(seq.request_id, new, seq.finished, seq.finish_reason,
                      logprobs=seq.output_logprobs[-len(new):] if new and seq.params.logprobs is not None else None,
                      prompt_logprobs=seq.prompt_logprobs if first else None)


def error_output(seq: Sequence) -> StepOutput:
    return StepOutput(seq.request_id, [], True, "error", error=f"{type(seq.error).__name__}: {seq.error}")


def request_output(seq: Sequence, tokenizer) -> RequestOutput:
    """A finished request's result; one the engine ended with an error raises that error."""
    if seq.error is not None:
        raise seq.error
    text = IncrementalText(tokenizer, seq.params.stop)
    text.add(seq.output_ids)
    return RequestOutput(seq.request_id, seq.prompt_ids, list(seq.output_ids), text.text, seq.finish_reason,
                         seq.metrics(), logprobs=list(seq.output_logprobs) if seq.params.logprobs is not None
                         else None, prompt_logprobs=seq.prompt_logprobs)
