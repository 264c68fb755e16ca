"""The server's timing split (`msa_eval_timings`, engine.server.timings) on a real `msa-eval serve`.

One MSA server (default model, CPU, top-k 4 so that a 600-token prompt is sparse, one request
decoded at a time so that a second request waits) driven by the official `openai` client, which
must still parse every response (the field lands in `model_extra`); then our openai backend reads
the split into its GenResult.
"""
from __future__ import annotations

import concurrent.futures

import openai
import pytest

from engine.sampling import SamplingParams
from engine.sequence import Sequence
from engine.server.timings import TIMINGS_FIELD, request_timings
from msa_eval.backends.base import GenRequest
from msa_eval.backends.openai_backend import OpenAIBackend, OpenAIBackendConfig
from tests.engine.serve_process import running_server

MODEL = "smollm2-135m"
KEYS = {"queue_s", "prefill_s", "ttft_s", "decode_s", "attention_density"}
# about 600 tokens: 5 blocks of 128 keys, of which top-k 4 reads at most 4 per query; SHORT: one block
LONG = " ".join(f"Item {i} of the list is the word {w}." for i, w in enumerate(["apple", "river", "stone"] * 25))
SHORT = LONG[:200]


@pytest.fixture(scope="module")
def base_url():
    with running_server("--attention", "msa", "--msa-topk", "4", "--max-batch", "1", "--max-queue", "4",
                        "--max-model-len", "2048") as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)


def _check(t: dict, completion_tokens: int) -> None:
    assert set(t) == KEYS, t
    assert all(v >= 0 for v in t.values())
    assert t["ttft_s"] == pytest.approx(t["queue_s"] + t["prefill_s"], abs=1e-5)
    assert t["prefill_s"] > 0 and (t["decode_s"] > 0) == (completion_tokens > 1)
    assert 0 < t["attention_density"] <= 1


def _messages(text: str = SHORT) -> list[dict]:
    return [{"role": "user", "content": text + "\nWhich word comes last?"}]


def test_chat_body_and_both_stream_endings_carry_the_split(client):
    r = client.chat.completions.create(model=MODEL, messages=_messages(LONG), temperature=0, max_tokens=4)
    _check(r.model_extra[TIMINGS_FIELD], r.usage.completion_tokens)
    assert r.model_extra[TIMINGS_FIELD]["attention_density"] < 0.9  # top-k 4 of 5 blocks: sparse
    r = client.chat.completions.create(model=MODEL, messages=_messages(), temperature=0, max_tokens=8)
    chunks = list(client.chat.completions.create(model=MODEL, messages=_messages(), temperature=0, max_tokens=8,
                                                 stream=True, stream_options={"include_usage": True}))
    carrying = [i for i, c in enumerate(chunks) if (c.model_extra or {}).get(TIMINGS_FIELD)]
    assert carrying == [len(chunks) - 1] and chunks[-1].usage is not None  # the usage chunk, only
    _check(chunks[-1].model_extra[TIMINGS_FIELD], chunks[-1].usage.completion_tokens)
    chunks = list(client.chat.completions.create(model=MODEL, messages=_messages(), temperature=0, max_tokens=8,
                                                 stream=True))
    carrying = [c for c in chunks if (c.model_extra or {}).get(TIMINGS_FIELD)]
    assert len(carrying) == 1 and carrying[0].choices[0].finish_reason is not None  # no usage: the finish chunk
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


def test_completions_one_prompt_several_prompts_and_stream(client):
    r = client.completions.create(model=MODEL, prompt=SHORT, temperature=0, max_tokens=6)
    _check(r.model_extra[TIMINGS_FIELD], r.usage.completion_tokens)
    several = client.completions.create(model=MODEL, prompt=[SHORT, SHORT[:100]], temperature=0, max_tokens=6)
    assert several.model_extra[TIMINGS_FIELD] is None
    for choice in several.choices:  # each choice its own split
        assert set(choice.model_extra[TIMINGS_FIELD]) == KEYS
    chunks = list(client.completions.create(model=MODEL, prompt=SHORT, temperature=0, max_tokens=6, stream=True))
    carrying = [c for c in chunks if (c.model_extra or {}).get(TIMINGS_FIELD)]
    assert len(carrying) == 1 and carrying[0].choices[0].finish_reason is not None
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text


def test_a_request_behind_another_reports_its_wait_as_queue_time(client):
    """--max-batch 1: the second of two simultaneous requests waits for the first to finish."""
    def ask(_: int):
        return client.chat.completions.create(model=MODEL, messages=_messages(), temperature=0, max_tokens=24,
                                              extra_body={"ignore_eos": True}).model_extra[TIMINGS_FIELD]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first, second = sorted(pool.map(ask, range(2)), key=lambda t: t["queue_s"])
    busy = first["prefill_s"] + first["decode_s"]
    assert second["queue_s"] >= 0.9 * busy > 0 and first["queue_s"] < 0.5 * busy


@pytest.mark.parametrize("stream", [True, False])
def test_openai_backend_reads_the_split(base_url, stream):
    b = OpenAIBackend(OpenAIBackendConfig(base_url=base_url, model=MODEL, stream=stream, max_retries=0))
    [r] = b.generate([GenRequest(id="s", messages=_messages(), max_tokens=8)])
    b.close()
    assert r.error is None and r.completion_tokens > 1
    assert r.queue_s is not None and r.prefill_s > 0 and r.decode_s > 0 and 0 < r.extra["attention_density"] <= 1
    assert r.extra["server_ttft_s"] == pytest.approx(r.queue_s + r.prefill_s, abs=1e-5)
    if stream:  # measured here, so it includes the HTTP exchange and tokenising the prompt
        assert r.ttft_s >= r.extra["server_ttft_s"]
    else:
        assert r.ttft_s == r.extra["server_ttft_s"]
    assert r.extra["cost_usd"] == 0.0  # configs/prices.yaml lists our own server's model at 0


def test_split_of_an_engine_sequence():
    seq = Sequence("r", [1, 2, 3], SamplingParams(max_tokens=4), max_len=16)
    seq.first_scheduled, seq.first_token, seq.finish_time = 10.5, 12.0, 13.25
    assert request_timings(seq, 10.0) == {"queue_s": 0.5, "prefill_s": 1.5, "ttft_s": 2.0, "decode_s": 1.25}
    seq.keys_read, seq.keys_dense = 1.0, 4.0  # MSA statistics: the density joins
    assert request_timings(seq, 10.0)["attention_density"] == 0.25
    scoring = Sequence("s", [1, 2], SamplingParams(max_tokens=0, prompt_logprobs=1), max_len=8)
    scoring.first_scheduled, scoring.finish_time = 1.0, 3.0  # score-only: no token, the prefill ends it
    assert request_timings(scoring, None) == {"prefill_s": 2.0}
