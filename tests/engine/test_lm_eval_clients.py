"""lm-eval end to end against the real `msa-eval serve` (issue 21): the log-likelihood request lm-eval sends
costs one prefill of its prompt, and lm-eval's own `local-completions` / `local-chat-completions` models
running the tiny local task YAMLs (tests/msa_eval/lm_eval_tiny) give what the in-process `msa-local`
bridge and greedy `LLM.generate` give.

One server (default model, dense, CPU, capacity 8) on 127.0.0.1; the in-process `default_llm` and the
bridge give the references.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

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


# -- lm-eval's own API models on the tiny task YAMLs ------------------------------------------------------------
TINY = Path(__file__).parents[1] / "msa_eval" / "lm_eval_tiny"
SCORED = ("msa_tiny_mc", "msa_tiny_roll")  # loglikelihood (multiple choice) and loglikelihood_rolling


@pytest.fixture(scope="module")
def task_manager(tmp_path_factory):
    lm_eval_tasks = pytest.importorskip("lm_eval.tasks")
    d = tmp_path_factory.mktemp("lm_eval_tasks")
    for y in TINY.glob("*.yaml"):
        (d / y.name).write_text(y.read_text().replace("DATA_FILE", str(TINY / "tiny.jsonl")))
    return lm_eval_tasks.TaskManager(include_path=str(d), include_defaults=False)  # the tiny tasks only


def _evaluate(task_manager, model: str, model_args: dict, tasks: list[str], **kw) -> dict:
    import lm_eval

    with pytest.MonkeyPatch.context() as mp:  # the task data is a local file: no hub look-ups
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, task_manager=task_manager,
                                      log_samples=True, **kw)
    assert out is not None
    return {t: sorted(s, key=lambda x: x["doc_id"]) for t, s in out["samples"].items()}


@pytest.mark.slow
def test_local_completions_equals_the_msa_local_bridge(base_url, default_llm, task_manager, tmp_path):
    """lm-eval's `local-completions` (token ids through /v1/completions, echo + logprobs, the tokenizer from
    `export-tokenizer`'s files through lm-eval's huggingface backend) on the multiple-choice and rolling tiny
    tasks: every request's log-likelihood equals the in-process `msa-local` bridge's within 1e-4, and so
    does the is-greedy flag."""
    pytest.importorskip("aiohttp")
    import msa_eval.lm_eval_bridge  # noqa: F401 - registers msa-local (and, before it, lm-eval's own models)
    from engine.tokenizer_export import write_hf_tokenizer

    tok_dir = tmp_path / "tok"
    write_hf_tokenizer(default_llm.tokenizer, tok_dir, default_llm.max_model_len)
    remote = _evaluate(task_manager, "local-completions",
                       {"model": MODEL, "base_url": base_url + "/completions", "tokenizer_backend": "huggingface",
                        "tokenizer": str(tok_dir), "num_concurrent": 2, "max_retries": 1}, list(SCORED))
    local = _evaluate(task_manager, "msa-local", {"model": MODEL, "attention": "dense"}, list(SCORED))
    for task in SCORED:
        assert len(remote[task]) == len(local[task]) == 4
        for r, s in zip(remote[task], local[task], strict=True):
            assert r["arguments"] == s["arguments"]  # the same requests
            got, want = [x[0] for x in r["resps"]], [x[0] for x in s["resps"]]
            if task == "msa_tiny_mc":  # (log-likelihood, is greedy) per choice
                assert [g for _, g in got] == [g for _, g in want]
                got, want = [ll for ll, _ in got], [ll for ll, _ in want]
            assert got == pytest.approx(want, abs=1e-4) and all(x < 0 for x in got)


@pytest.mark.slow
def test_local_chat_completions_generate_until_equals_llm_generate(base_url, default_llm, task_manager):
    """lm-eval's `local-chat-completions` (`--apply_chat_template`: the chat history as messages) on the
    generate_until tiny task: each response equals greedy `LLM.generate` on the same messages with the model's
    chat template, the task's `until` strings and `max_gen_toks`."""
    pytest.importorskip("aiohttp")
    samples = _evaluate(task_manager, "local-chat-completions",
                        {"model": MODEL, "base_url": base_url + "/chat/completions", "num_concurrent": 2,
                         "max_retries": 1}, ["msa_tiny_gen"], apply_chat_template=True)["msa_tiny_gen"]
    assert len(samples) == 4
    for s in samples:
        [(context, gen_kwargs)] = [(a[0][0], a[1]) for a in s["arguments"]]
        messages = json.loads(context)
        assert messages[-1]["role"] == "user" and s["doc"]["question"] in messages[-1]["content"]
        want = default_llm.generate([messages], _greedy(gen_kwargs["max_gen_toks"], gen_kwargs["until"]))[0].text
        assert s["resps"] == [[want]]
