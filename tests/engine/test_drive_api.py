"""The engine's drive API on a random CPU stack (no model file): `LLMEngine.stream` runs its requests
to the end and keeps them for `finish`, aborts what a caller leaves or cannot add; `finish` builds the
`RequestOutput` (text cut by `engine.textstream`, the request's error raised); and the settings that
come in at the edges (`python -m engine.server` reads the environment, `ServerConfig` carries it)."""
from __future__ import annotations

import pytest

from engine.requests import Request, request_output
from engine.sampling import SamplingParams
from engine.sequence import Sequence
from tests.engine.test_gpu_ops import _tiny_engine

FREE = SamplingParams(max_tokens=6, ignore_eos=True)


def _requests() -> list[Request]:
    return [Request("a", list(range(3, 50)), FREE), Request("b", list(range(7, 20)), FREE)]


def test_stream_runs_every_request_to_the_end_and_keeps_it_for_finish():
    eng = _tiny_engine()
    got: dict[str, list[int]] = {}
    ends = []
    for out in eng.stream(_requests()):
        got.setdefault(out.request_id, []).extend(out.new_token_ids)
        if out.finished:
            ends.append((out.request_id, out.finish_reason))
    assert sorted(ends) == [("a", "length"), ("b", "length")] and all(len(t) == 6 for t in got.values())
    assert not eng.has_unfinished() and sorted(eng.seqs) == ["a", "b"]
    assert eng.pop_finished("a").output_ids == got["a"] and sorted(eng.seqs) == ["b"]


def test_stream_left_early_aborts_its_requests():
    eng = _tiny_engine()
    outs = eng.stream(_requests())
    first = next(o for o in outs if o.new_token_ids)
    assert not first.finished
    outs.close()  # the caller stops listening (an exception in its loop does the same through closing())
    assert not eng.seqs and not eng.has_unfinished() and eng.blocks.free_pages == eng.blocks.num_pages


def test_stream_that_cannot_add_a_request_aborts_the_ones_added():
    eng = _tiny_engine()
    with pytest.raises(ValueError, match="empty prompt: give at least one token"):
        list(eng.stream([*_requests(), Request("c", [], FREE)]))
    assert not eng.seqs and not eng.has_unfinished() and eng.blocks.free_pages == eng.blocks.num_pages


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_finish_cuts_the_text_before_the_first_stop_string_and_raises_a_failed_request():
    seq = Sequence("r", [1, 2], SamplingParams(max_tokens=20, stop=["END", "xy"]), max_len=40)
    seq.output_ids = [ord(c) for c in "abENxyzEND!"]
    seq.finished, seq.finish_reason = True, "stop"
    out = request_output(seq, _CharTokenizer())
    assert (out.text, out.token_ids, out.finish_reason) == ("abEN", seq.output_ids, "stop")
    seq.error = RuntimeError("injected")
    with pytest.raises(RuntimeError, match="injected"):
        request_output(seq, _CharTokenizer())


def test_python_m_engine_server_reads_its_options_from_server_config_and_the_environment(monkeypatch):
    from engine.server.__main__ import parse_args
    from engine.server.config import ServerConfig

    for name in ("MSA_EVAL_WEIGHTS", "MSA_EVAL_KV_TOKENS", "MSA_EVAL_NO_DEQUANT_CACHE"):
        monkeypatch.delenv(name, raising=False)
    config, level = parse_args([])
    assert config == ServerConfig() and level == "warning"
    monkeypatch.setenv("MSA_EVAL_WEIGHTS", "q4")
    monkeypatch.setenv("MSA_EVAL_KV_TOKENS", "4096")
    monkeypatch.setenv("MSA_EVAL_NO_DEQUANT_CACHE", "1")
    config, _ = parse_args(["--attention", "msa", "--served-model-name", "a", "--served-model-name", "b"])
    assert (config.attention, config.served_model_names) == ("msa", ("a", "b"))
    assert (config.weights, config.kv_cache_tokens, config.dequant_cache) == ("q4", 4096, False)
    assert parse_args(["--weights", "bf16"])[0].weights == "bf16"  # the flag wins over the environment
    kw = config.llm_kwargs()
    assert (kw["weights"], kw["kv_cache_tokens"], kw["dequant_cache"], kw["max_num_seqs"]) == ("q4", 4096, False, 16)
    with pytest.raises(SystemExit):
        parse_args(["--attention", "msa-bogus"])
