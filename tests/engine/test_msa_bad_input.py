"""Bad MSA input gives one clear line naming the fix."""
from __future__ import annotations

import json

import pytest

from engine import LLM
from engine.config import ModelConfig
from engine.errors import UnsupportedModelError
from engine.loader import load
from engine.msa import AdapterError, IndexProjections, MSAConfig, MSAConfigError, base_fingerprint, save_adapter
from tests.engine.test_sparsify import make_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    ld = load(str(a), progress=False)
    proj = IndexProjections(ld.config, MSAConfig(block_size=64, topk=4, dense_layers=(0,)))
    proj.init_from_attention(ld.weights, ld.config)
    save_adapter(root / "ad", proj, {"model_id": "a", "fingerprint": base_fingerprint(ld.config, ld.weights)})
    return a, b, root / "ad"


def one_line(e: Exception) -> str:
    s = str(e)
    assert s and "\n" not in s
    return s


def make(model, **kw):
    return LLM(model, device="cpu", kv_cache_tokens=512, progress=False, **kw)


def test_good_adapter_loads(tiny):
    a, _, ad = tiny
    llm = make(f"{a}+{ad}", attention="msa")
    assert llm.msa.block_size == 64 and sorted(llm.cache.k_idx) == [1, 2]


def test_msa_without_indexer(tiny):
    with pytest.raises(AdapterError) as e:
        make(str(tiny[0]), attention="msa")
    assert "no MSA indexer" in one_line(e.value) and "sparsify" in str(e.value)


def test_adapter_for_another_base(tiny):
    _, b, ad = tiny
    with pytest.raises(AdapterError) as e:
        make(f"{b}+{ad}", attention="msa")
    assert "made for base model" in one_line(e.value)


def test_block_size_not_page_size(tiny):
    a, _, ad = tiny
    with pytest.raises(MSAConfigError) as e:
        make(f"{a}+{ad}", attention="msa", page_size=128)
    assert "page size" in one_line(e.value)


def test_corrupt_adapter(tiny, tmp_path):
    import shutil

    a, _, ad = tiny
    bad = tmp_path / "bad"
    shutil.copytree(ad, bad)
    blob = (bad / "indexer.safetensors").read_bytes()
    (bad / "indexer.safetensors").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(AdapterError) as e:
        make(f"{a}+{bad}", attention="msa")
    assert "corrupt" in one_line(e.value)
    (bad / "msa_config.json").write_text("{not json")
    with pytest.raises(AdapterError) as e:
        make(f"{a}+{bad}", attention="msa")
    assert "corrupt" in one_line(e.value)
    cfg = json.loads((ad / "msa_config.json").read_text())
    cfg.pop("tensors_sha256")
    (bad / "msa_config.json").write_text(json.dumps(cfg))
    with pytest.raises(AdapterError) as e:  # no recorded hash: safetensors itself must refuse it
        make(f"{a}+{bad}", attention="msa")
    assert "corrupt" in one_line(e.value)


def test_not_gqa_and_bad_settings():
    mha32 = ModelConfig(arch="llama", vocab_size=10, hidden_size=2048, num_layers=4, num_heads=32, num_kv_heads=1,
                        head_dim=64, intermediate_size=8, max_position=64)
    with pytest.raises(UnsupportedModelError) as e:
        MSAConfig().check_model(mha32)
    assert "GQA" in one_line(e.value)
    with pytest.raises(MSAConfigError) as e:
        MSAConfig(block_size=96)
    assert "block size" in one_line(e.value)
    with pytest.raises(MSAConfigError):
        MSAConfig.from_dict({"block_size": 64, "top_k": 8})


def test_cli_generate_msa_without_indexer_is_one_line(tiny):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "msa_eval.cli", "generate", "--model", str(tiny[0]), "--attention",
                        "msa", "--device", "cpu", "hi"], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "COLUMNS": "400"})
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "no MSA indexer" in lines[0], r.stderr


def test_dense_accepts_adapter_suffix_and_ignores_it(tiny):
    a, _, ad = tiny
    llm = make(f"{a}+{ad}", attention="dense")
    assert llm.cache.k_idx == {} and llm.engine.attention.kind == "dense" and llm.msa is None
    assert str(llm.msa_adapter_path) == str(ad)
