"""The indexer shipped for the default model (`engine/adapters/smollm2-135m/`): it loads against the
default model's fingerprint, runs the issue's B 128 / top-16 (trained at top-k 4, shipped at msa-spec's 16),
and its provenance records a command that reproduces the recorded settings (re-parsed with the `sparsify`
CLI)."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

ADAPTER = Path(__file__).resolve().parents[2] / "engine" / "adapters" / "smollm2-135m"


@pytest.fixture(scope="module")
def loaded():
    from engine.loader import load

    return load("smollm2-135m", progress=False)


def test_shipped_adapter_loads_for_the_default_model(loaded):
    from engine.msa import base_fingerprint, load_adapter

    ad = load_adapter(ADAPTER, loaded.config, base_fingerprint(loaded.config, loaded.weights))
    assert (ad.msa.block_size, ad.msa.topk) == (128, 16)
    assert set(ad.projections.layer_ids) == set(range(loaded.config.num_layers)) - set(ad.msa.dense_layers)
    assert (ADAPTER / "indexer.safetensors").stat().st_size < 16 * 2**20


def test_shipped_provenance_command_reproduces_its_settings():
    from msa_eval.cli.sparsify import sparsify_cmd

    prov = json.loads((ADAPTER / "provenance.json").read_text())
    meta = json.loads((ADAPTER / "msa_config.json").read_text())
    assert prov["msa"] == meta["msa"] and prov["base"]["fingerprint"] == meta["base"]["fingerprint"]
    argv = shlex.split(prov["command"])
    assert argv[:2] == ["msa-eval", "sparsify"] and "--seed" in argv
    ctx = sparsify_cmd.make_context("sparsify", argv[2:])
    p, s = ctx.params, prov["settings"]
    for key in ("tokens", "seq_len", "warmup_steps", "steps", "queries", "lr", "seed"):
        assert p[key] == s[key], key
    assert (int(p["block_size"]), int(p["topk"])) == (s["block_size"], s["topk"])
    for key, default in (("teacher", "mean"), ("long_range", 0.0), ("recurrence", 0.0)):
        assert p[key] == s.get(key, default), key
    dense = prov["msa"]["dense_layers"]
    assert (p["dense_layers"] is None and dense == [0, 1]) or [int(x) for x in p["dense_layers"].split(",")] == dense
    assert all(0.0 < v["recall_after"] <= 1.0 for v in prov["layers"].values())
