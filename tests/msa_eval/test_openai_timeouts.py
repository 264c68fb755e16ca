"""Per-attempt timeouts of the `openai` backend that grow with the prompt (timeout_s + an allowance per
1K tokens of prompt + max_tokens), against a real slow HTTP server on 127.0.0.1 (`ScriptedOpenAI`
answering after a fixed delay): the same server times a short prompt out and answers a long one."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from msa_eval.backends.base import BackendError, GenRequest
from msa_eval.backends.factory import make_backend
from msa_eval.backends.openai_backend import OpenAIBackend, OpenAIBackendConfig
from msa_eval.runner.config import BackendSpec, RunConfig, SuiteConfig
from tests.msa_eval.scripted_openai_server import ScriptedOpenAI

DELAY_S = 1.0
LONG = "x" * 3000  # 3000 bytes: estimated 1000 tokens


def _backend(server: ScriptedOpenAI, counter=None, **kw) -> OpenAIBackend:
    opts = dict(base_url=server.base_url, model="m", max_retries=0, timeout_s=0.3, timeout_per_1k_tokens_s=1.0)
    return OpenAIBackend(OpenAIBackendConfig(**{**opts, **kw}), token_counter=counter)


@pytest.mark.parametrize("stream", [True, False])
def test_the_same_slow_server_times_out_a_short_prompt_and_answers_a_long_one(stream):
    with ScriptedOpenAI(delay_s=DELAY_S) as server:
        b = _backend(server, stream=stream)
        t0 = time.perf_counter()
        [short] = b.generate([GenRequest(id="short", prompt="question", max_tokens=16)])
        short_s = time.perf_counter() - t0
        [long] = b.generate([GenRequest(id="long", prompt=LONG, max_tokens=16)])  # 0.3 + 1.0 * 1016 / 1000 s
        b.close()
    assert short.finish_reason == "error" and "no answer within 0.3 s" in short.error and short_s < DELAY_S
    assert "timeout_per_1k_tokens_s 1 per 1K tokens" in short.error  # names the knob to turn
    assert long.error is None and long.text == server.text and long.latency_s >= DELAY_S


def test_attempt_timeout_formula_and_the_token_counter():
    with ScriptedOpenAI(delay_s=DELAY_S) as server:
        b = _backend(server)
        assert b.attempt_timeout_s(1000, 24) == pytest.approx(0.3 + 1.024)
        assert b._prompt_tokens(LONG) == 1000 and b._prompt_tokens("é" * 3) == 2  # UTF-8 bytes / 3, rounded up
        counted = _backend(server, counter=lambda text: 10)  # a counter's count wins over the estimate
        [r] = counted.generate([GenRequest(id="c", prompt=LONG, max_tokens=16)])  # 0.3 + 0.026 s: too short
        counted.close()
    assert r.finish_reason == "error" and "no answer within 0.3 s" in r.error
    defaults = OpenAIBackendConfig(base_url="http://127.0.0.1:9/v1", model="m")
    assert (defaults.timeout_s, defaults.timeout_per_1k_tokens_s) == (120.0, 5.0)
    assert OpenAIBackend(defaults).attempt_timeout_s(1 << 20, 64) == pytest.approx(120 + 5 * 1048.64)


@pytest.mark.parametrize("name,value", [("timeout_per_1k_tokens_s", 0), ("timeout_per_1k_tokens_s", -1),
                                        ("timeout_s", 0), ("timeout_s", -2.5)])
def test_zero_or_negative_timeouts_are_one_line_naming_the_option(name, value):
    with pytest.raises(BackendError) as e:
        make_backend("openai", base_url="http://127.0.0.1:9/v1", model="m", **{name: value})
    assert str(e.value) == f"{name} must be > 0 seconds, got {value}"


def test_timeouts_are_not_part_of_the_run_identity():
    suite = SuiteConfig("s", ())

    def cfg(**opts) -> RunConfig:
        return RunConfig(suite, (BackendSpec("openai", "m", base_url="http://h/v1", options=opts),), "ref")

    assert cfg().config_hash() == cfg(timeout_s=5, timeout_per_1k_tokens_s=9.5).config_hash()
    assert cfg().config_hash() != cfg(chat_only=True).config_hash()


def test_cli_refuses_a_zero_allowance_in_one_line(tmp_path):
    argv = [sys.executable, "-m", "msa_eval", "run", "helmet", "--backend", "openai", "--base-url",
            "http://127.0.0.1:9/v1", "--model", "m", "--tasks", "niah_single", "--lengths", "1k", "--samples", "1",
            "--backend-opt", "timeout_per_1k_tokens_s=0", "--out", str(tmp_path / "run")]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "timeout_per_1k_tokens_s must be > 0 seconds, got 0" in lines[-1], p.stderr


def test_endpoint_presets_carry_the_timeouts_and_refuse_a_zero_one(tmp_path):
    from msa_eval.backends.endpoints import load_preset
    from msa_eval.errors import MsaEvalError
    from msa_eval.judge import parse_judge_spec

    slow = tmp_path / "slow.yaml"
    slow.write_text("base_url: http://127.0.0.1:9/v1\nmodel: m\ntimeout_s: 30\ntimeout_per_1k_tokens_s: 12.5\n")
    assert load_preset(str(slow)).backend_options() == {"timeout_s": 30, "timeout_per_1k_tokens_s": 12.5}
    spec = parse_judge_spec(f"preset:{slow}", {"timeout_s": 60})  # the command line wins over the preset
    assert spec.options == {"timeout_s": 60, "timeout_per_1k_tokens_s": 12.5}
    assert load_preset("minimax").backend_options() == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("base_url: http://127.0.0.1:9/v1\nmodel: m\ntimeout_per_1k_tokens_s: 0\n")
    with pytest.raises(MsaEvalError, match="timeout_per_1k_tokens_s: Input should be greater than 0") as e:
        load_preset(str(bad))
    assert "\n" not in str(e.value)
