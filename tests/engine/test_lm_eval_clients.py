"""lm-eval end to end against the real `msa-eval serve` (issue 21): the log-likelihood request lm-eval sends
costs one prefill of its prompt, and lm-eval's own `local-completions` / `local-chat-completions` models
running the tiny local task YAMLs (tests/msa_eval/lm_eval_tiny) give what the in-process `msa-local`
bridge and greedy `LLM.generate` give.

One server (default model, dense, CPU, capacity 8) on 127.0.0.1; the in-process `default_llm` and the
bridge give the references.
"""
from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
TEXT = "The history of the city begins with a small fishing village on the river, which grew into a trading port."


@pytest.fixture(scope="module")
def base_url():
    with running_server("--max-batch", "8", "--max-queue", "0") as url:
        yield url


def _counters(base_url: str) -> tuple[float, float]:
    """(msa_forward_passes_total, msa_prefill_tokens_total) from /metrics."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics").text
    found = [re.search(rf"^{name}_total ([0-9.e+-]+)$", text, re.M) for name in ("msa_forward_passes",
                                                                              "msa_prefill_tokens")]
    assert all(found), "msa_forward_passes / msa_prefill_tokens missing from /metrics"
    return float(found[0].group(1)), float(found[1].group(1))  # type: ignore[union-attr]


def _counters_after(base_url: str, before: tuple[float, float], prefill: int) -> tuple[float, float]:
    """The counters once the engine thread has added this request's prefill (it updates /metrics right
    after the step that answered), as deltas from `before`."""
    deadline = time.monotonic() + 10
    while True:
        passes, tokens = _counters(base_url)
        if tokens - before[1] >= prefill or time.monotonic() > deadline:
            return passes - before[0], tokens - before[1]
        time.sleep(0.05)


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_lm_eval_loglikelihood_request_is_one_prefill(base_url, default_llm, max_tokens):
    """lm-eval's request shape (token ids, echo, logprobs=1, max_tokens 1 or 0, temperature 0): one forward
    pass over the prompt's tokens, whose last row also draws the token (max_tokens 1); the prompt rows equal
    the in-process scores within 1e-4 and the drawn token is the greedy one."""
    ids = default_llm.tokenizer.encode(TEXT)
    before = _counters(base_url)
    body = {"model": MODEL, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(base_url + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    passes, prefill = _counters_after(base_url, before, len(ids))
    assert (passes, prefill) == (1, len(ids))
    choice = r.json()["choices"][0]
    want = default_llm.prompt_logprobs(ids, top_n=1)
    got = choice["logprobs"]["token_logprobs"]
    assert got[0] is None and got[1:len(ids)] == pytest.approx([lp for lp, _ in want[1:]], abs=1e-4)
    assert r.json()["usage"]["completion_tokens"] == max_tokens and len(got) == len(ids) + max_tokens
    if max_tokens:
        greedy = default_llm.generate(ids, _greedy(1))[0]
        assert choice["logprobs"]["tokens"][-1] == default_llm.tokenizer.decode(greedy.token_ids,
                                                                                 skip_special_tokens=False)


def _greedy(n: int, stop: list[str] | None = None):
    from engine import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0, stop=stop or [])
