"""The local backend's batching per device (`msa_eval.backends.local.BATCHING`): on the CPU the runner sends
one request at a time and the engine decodes up to 8 together; on a GPU 64 requests go at once into an engine
that decodes 64 and prefills 16384 tokens per step (a GPU run left at the CPU's sizes ran several times slower).
Checked on the real default model (CPU) and the runner's own setup; explicit options always win."""
from __future__ import annotations

import pytest

from msa_eval.backends.local import BATCHING, LocalBackend, batching
from msa_eval.cli.run_setup import RunArgs, prepare


def _args(tmp_path, concurrency=None, opts=()):
    return RunArgs("helmet", "local", None, "dense", None, None, "512", 1, "niah_single", None, None,
                   concurrency, None, tmp_path / "r", opts)


def test_defaults_follow_the_device():
    assert batching("cpu") == BATCHING["cpu"] and batching("cuda:0") == BATCHING["cuda"]
    assert BATCHING["cuda"].concurrency == BATCHING["cuda"].max_num_seqs > BATCHING["cpu"].max_num_seqs


@pytest.mark.parametrize(("opts", "want"), [((), BATCHING["cpu"].concurrency),
                                            (("device=cuda",), BATCHING["cuda"].concurrency)])
def test_runner_concurrency_default(tmp_path, opts, want):
    assert prepare(_args(tmp_path, opts=opts)).cfg.concurrency == want
    assert prepare(_args(tmp_path, concurrency=5, opts=opts)).cfg.concurrency == 5


def test_engine_sizes_on_the_real_model():
    sched = LocalBackend(device="cpu", progress=False).llm.engine.scheduler.cfg
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (BATCHING["cpu"].max_num_seqs,
                                                                 BATCHING["cpu"].max_num_batched_tokens)
    sched = LocalBackend(device="cpu", progress=False, max_num_seqs=3, max_num_batched_tokens=512
                         ).llm.engine.scheduler.cfg
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (3, 512)
