"""Scoring is scheduled like any prefill (issue 19, defect 6): prompt log-probs are computed in the
request's own prefill chunks (at most `max_scored_tokens` scored rows a step), interleaved with other
requests' decode steps, equal to a one-shot forward; through the real server a long echo+logprobs
request no longer holds a short chat behind it."""
from __future__ import annotations

import asyncio

import openai
import pytest
import torch

from engine import SamplingParams
from engine.attention.dense import DenseAttention
from engine.kv_cache import CacheConfig, KVCache
from engine.llm_engine import LLMEngine
from engine.scheduler import SchedulerConfig
from tests.engine.serve_process import running_server
from tests.engine.test_parity_hf import all_logits

MODEL = "smollm2-135m"
TEXT = ("The history of the city begins with a small fishing village on the river. Over the centuries it grew "
        "into a trading port, then a centre of learning with a university, a cathedral and a busy market. ")


def one_shot(llm, ids: list[int], top_n: int) -> list[tuple[float | None, dict[int, float]]]:
    """The old `prompt_logprobs`: one forward over every token, log-softmax, per-row top-n."""
    lp = torch.log_softmax(all_logits(llm, ids), -1)
    rows = [(None, {})]
    for t in range(1, len(ids)):
        v, i = torch.topk(lp[t - 1], top_n)
        rows.append((float(lp[t - 1, ids[t]]), {int(a): float(b) for a, b in zip(i, v, strict=True)}))
    return rows


def assert_rows_close(got, want, tol: float = 1e-4) -> None:
    assert len(got) == len(want) and got[0] == (None, {})
    for (lp, top), (lp0, top0) in zip(got[1:], want[1:], strict=True):
        assert lp == pytest.approx(lp0, abs=tol)
        assert list(top) == list(top0)  # the same alternatives, in the same order
        assert list(top.values()) == pytest.approx(list(top0.values()), abs=tol)


@pytest.fixture(scope="module")
def engine(default_llm):
    """A fresh engine over the default model's weights with 128 scored rows a step (the shared
    `default_llm.engine` is left alone)."""
    cfg, llm = default_llm.config, default_llm
    cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                    CacheConfig(page_size=llm.cache.page_size, num_pages=16, dtype=llm.kv_dtype), torch.device("cpu"))
    return LLMEngine(llm.model, llm.tokenizer, DenseAttention(cfg.head_dim ** -0.5), cache,
                     SchedulerConfig(8, 2048, max_scored_tokens=128), llm.max_model_len, torch.device("cpu"))


def test_chunked_scoring_equals_one_shot(default_llm):
    """`LLM.prompt_logprobs` (now a score-only engine request, 512 scored rows a step) on 570+ tokens of
    real text: equal to the one-shot forward within 1e-4, the same top-5 alternatives."""
    ids = default_llm.tokenizer.encode(TEXT * 14)
    assert len(ids) > default_llm.engine.scheduler.cfg.max_scored_tokens  # at least two chunks
    assert_rows_close(default_llm.prompt_logprobs(ids, top_n=5), one_shot(default_llm, ids, 5))


def test_scoring_interleaves_with_decode(engine, default_llm):
    """A 300-token score-only request (128 scored rows a step) and a 2-token greedy request added together:
    the short one decodes while the long one is scored chunk by chunk (steps 1-3), and finishes first;
    both results equal what each gives alone (the scores: the one-shot forward)."""
    long_ids = default_llm.tokenizer.encode(TEXT * 8)[:300]
    assert len(long_ids) == 300
    short_ids = default_llm.tokenizer.encode("The capital of France is")
    greedy = SamplingParams(max_tokens=2, ignore_eos=True)
    engine.add_request("score", long_ids, SamplingParams(max_tokens=0, prompt_logprobs=2))
    engine.add_request("chat", short_ids, greedy)
    finished_at, tokens, prompt_rows, step = {}, [], None, 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            assert out.error is None
            if out.request_id == "chat":
                tokens += out.new_token_ids
            elif out.prompt_logprobs is not None:
                prompt_rows = out.prompt_logprobs
            if out.finished:
                finished_at[out.request_id] = (step, out.finish_reason)
                engine.pop_finished(out.request_id)
    assert finished_at == {"chat": (2, "length"), "score": (3, "length")}  # ceil(300 / 128) = 3 scoring steps
    assert engine.blocks.free_pages == engine.blocks.num_pages
    assert_rows_close(prompt_rows, one_shot(default_llm, long_ids, 2))
    assert tokens == default_llm.generate(short_ids, greedy)[0].token_ids


def test_generated_token_logprobs_come_from_the_sampling_logits(default_llm):
    """`logprobs` rows of generated tokens (greedy, 5 tokens) equal the one-shot forward over prompt +
    output, and each greedy token is its row's top alternative."""
    ids = default_llm.tokenizer.encode("Once upon a time, in a land far away,")
    out = default_llm.generate(ids, SamplingParams(max_tokens=5, logprobs=3, prompt_logprobs=3))[0]
    whole = one_shot(default_llm, ids + out.token_ids, 3)
    assert_rows_close(out.prompt_logprobs, whole[:len(ids)])
    assert_rows_close([(None, {})] + out.logprobs, [(None, {})] + whole[len(ids):])
    assert all(next(iter(top)) == t for (_, top), t in zip(out.logprobs, out.token_ids, strict=True))


def test_score_only_needs_prompt_logprobs():
    with pytest.raises(ValueError, match="0 only with prompt_logprobs"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="max_scored_tokens must be >= 1"):
        SchedulerConfig(max_scored_tokens=0)


def test_long_scoring_request_does_not_hold_a_short_chat(default_llm):
    """Through the real server: a 3,584-token echo+logprobs completion (max_tokens 1, lm-eval's shape: 7
    scoring steps of 512 rows) and a 4-token chat sent just after it (admitted by step 2, done by step 5);
    the chat finishes first (order of completion, not a time threshold; before the fix the one-shot
    scoring call ran on the engine thread while the chat still had tokens to go), and the scores equal
    the in-process ones (themselves equal to a one-shot forward, above) on a 600-token prefix;
    max_tokens 0 scores without generating."""
    tok = default_llm.tokenizer
    long_ids = tok.encode(TEXT * 100)[:3584]
    assert len(long_ids) == 3584
    chat = [{"role": "user", "content": "Say hello."}]
    expected_chat = default_llm.generate([chat], SamplingParams(max_tokens=4, ignore_eos=True))[0].text

    async def race(base_url: str):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
        order: list[str] = []

        async def score():
            r = await client.completions.create(model=MODEL, prompt=long_ids, max_tokens=1, temperature=0, echo=True,
                                                logprobs=1)
            order.append("score")
            return r

        async def talk():
            await asyncio.sleep(0.2)  # the scoring request is in the engine first
            r = await client.chat.completions.create(model=MODEL, messages=chat, temperature=0, max_tokens=4,
                                                     extra_body={"ignore_eos": True})
            order.append("chat")
            return r

        try:
            scored, talked = await asyncio.gather(score(), talk())
            zero = await client.completions.create(model=MODEL, prompt=long_ids[:40], max_tokens=0, echo=True,
                                                   logprobs=2)
        finally:
            await client.close()
        return order, scored, talked, zero

    with running_server("--max-batch", "8", "--max-queue", "8") as url:
        order, scored, talked, zero = asyncio.run(race(url))
    assert order == ["chat", "score"]
    assert talked.choices[0].message.content == expected_chat
    lp = scored.choices[0].logprobs
    assert len(lp.token_logprobs) == len(long_ids) + 1 and scored.usage.completion_tokens == 1
    want = default_llm.prompt_logprobs(long_ids[:600], top_n=2)  # a causal prefix across one chunk boundary
    assert lp.token_logprobs[1:600] == pytest.approx([x for x, _ in want[1:]], abs=1e-4)
    assert all(len(top) == 1 for top in lp.top_logprobs[1:])
    z = zero.choices[0]
    assert zero.usage.completion_tokens == 0 and z.text == tok.decode(long_ids[:40], skip_special_tokens=False)
    assert z.logprobs.token_logprobs[0] is None and len(z.logprobs.token_logprobs) == 40
    assert z.logprobs.token_logprobs[1:] == pytest.approx([x for x, _ in want[1:40]], abs=1e-4)
    assert all(len(top) == 2 for top in z.logprobs.top_logprobs[1:])
