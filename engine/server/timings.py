"""The server's timing split of one request: the extension field `msa_eval_timings` of its response.

Every generation response carries it (`/v1/chat/completions` and `/v1/completions`; non-streaming:
in the body, for several completion prompts in each choice; streaming: in the final chunk that
carries `usage` when `stream_options.include_usage` is set, else in the chunk with `finish_reason`).
The official `openai` client keeps it in the object's `model_extra`. The name is ours (llama.cpp's
server sends a `timings` object with other keys), so no client mistakes it for its own. Keys, in
seconds on the server's clock, each present when it is known:

  queue_s             from the route handing the tokenised prompt to the engine thread to the
                      request's first scheduled step (waiting for a running step, the scheduler's queue)
  prefill_s           first scheduled step -> first generated token (the engine's `Sequence.metrics`)
  ttft_s              hand-off -> first generated token (= queue_s + prefill_s)
  decode_s            first generated token -> finished
  attention_density   MSA only: keys attended / keys dense attention would attend, over all layers and steps

Tokenising the prompt (before the hand-off) is in none of them. A request cut short by a stop
string the route saw before the engine did has none (the field is null).
"""
from __future__ import annotations

from typing import Any

TIMINGS_FIELD = "msa_eval_timings"


def request_timings(seq: Any, submitted: float | None) -> dict[str, float]:
    """The split of a finished `engine.sequence.Sequence` handed to the engine at `submitted` (perf_counter)."""
    out: dict[str, float] = {}
    start, first, end = seq.first_scheduled, seq.first_token, seq.finish_time
    if submitted is not None and start is not None:
        out["queue_s"] = start - submitted
    prefill_end = first if first is not None else end  # a score-only request ends with its prefill
    if start is not None and prefill_end is not None:
        out["prefill_s"] = prefill_end - start
    if submitted is not None and first is not None:
        out["ttft_s"] = first - submitted
    if first is not None and end is not None:
        out["decode_s"] = end - first
    density = seq.metrics().get("attention_density")
    if density is not None:
        out["attention_density"] = float(density)
    return {k: round(max(v, 0.0), 6) for k, v in out.items()}
