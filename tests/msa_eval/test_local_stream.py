"""The local backend's streaming (`LocalBackend.generate_stream`) on the real default model (CPU): at most `window`
requests held by the engine, the next one handed over as one finishes, results in finishing order equal to
`LLM.generate`'s, a bad request an error result beside good ones, an early close aborting the rest; and the runner
writing each record as its request finishes rather than per batch."""
from __future__ import annotations

import json

import pytest

from msa_eval.backends.base import GenRequest
from msa_eval.backends.local import LocalBackend
from msa_eval.cli.run_setup import RunArgs, prepare
from msa_eval.runner import run_suite

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,", "The sky is"]
BUDGETS = [9, 2, 6, 1, 4]  # different lengths, so requests finish out of submission order


@pytest.fixture(scope="module")
def backend():
    return LocalBackend(device="cpu", progress=False, max_num_seqs=8)


def _requests():
    pairs = enumerate(zip(PROMPTS, BUDGETS, strict=True))
    return [GenRequest(id=f"r{i}", prompt=p, max_tokens=n) for i, (p, n) in pairs]


def test_window_bounds_what_the_engine_holds_and_results_match_generate(backend, monkeypatch):
    from engine import SamplingParams

    eng = backend.llm.engine
    held = []
    step = eng.step
    monkeypatch.setattr(eng, "step", lambda: (held.append(len(eng.seqs)), step())[1])
    got = list(backend.generate_stream(_requests(), window=2))
    assert max(held) == 2 and sorted(r.id for r in got) == [f"r{i}" for i in range(len(PROMPTS))]
    assert [r.id for r in got] != [f"r{i}" for i in range(len(PROMPTS))]  # finishing order, not submission
    ref = backend.llm.generate(PROMPTS, [SamplingParams(max_tokens=n, temperature=0.0) for n in BUDGETS])
    by_id = {r.id: r for r in got}
    for i, out in enumerate(ref):
        r = by_id[f"r{i}"]
        assert (r.text, r.completion_tokens, r.finish_reason) == (out.text, len(out.token_ids), "length")
    assert not eng.seqs and not eng.has_unfinished()


def test_a_bad_request_is_an_error_result_beside_good_ones(backend):
    reqs = _requests()[:2] + [GenRequest(id="long", prompt="word " * 9000, max_tokens=4)]
    got = {r.id: r for r in backend.generate_stream(reqs, window=2)}
    assert got["long"].finish_reason == "error" and "context" in got["long"].error
    assert all(got[i].finish_reason == "length" and got[i].text for i in ("r0", "r1"))


def test_closing_early_aborts_the_rest(backend):
    stream = backend.generate_stream(_requests(), window=3)
    first = next(stream)
    stream.close()
    eng = backend.llm.engine
    assert first.finish_reason == "length" and not eng.seqs and not eng.has_unfinished()


def test_runner_writes_each_record_as_its_request_finishes(tmp_path):
    prep = prepare(RunArgs("helmet", "local", None, "dense", None, None, "512", 3, "niah_single", None, None,
                           3, None, tmp_path / "r"))
    records = prep.run_dir / "records.jsonl"
    seen = []

    def progress(event, **info):
        if event == "advance":
            seen.append((info["n"], records.read_text().count("\n")))

    result = run_suite(prep.cfg, prep.run_dir, prep.plan, prep.reference_info, progress=progress,
                       reference_tokenizer=prep.tokenizer)
    assert seen == [(1, 1), (1, 2), (1, 3)]  # one record at a time, all three requests in flight together
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert result.generated == 3 and {r["status"] for r in rows} == {"ok"}
    assert sorted(r["sample_id"] for r in rows) == sorted(s.id for p in prep.plan for s in p.samples)
