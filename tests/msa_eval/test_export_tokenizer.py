"""`msa-eval export-tokenizer MODEL DIR`: the files it writes load in transformers' AutoTokenizer, which then
encodes, decodes and applies the chat template exactly as the engine's tokenizer does (the default model
by its built-in name, and an HF directory of it); an existing export is refused without --force."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n\nnew lines  ", "Zürich, naïve café, 東京タワー, Привет",
         "emoji 🙂👍🏽 and maths ∑ x² ≤ 3.14159", "1234567890 digits, 0.5e-3", "<|im_start|>user\nhi<|im_end|>\n",
         "<|endoftext|>text after a special<|im_end|>", "", "a" * 300]
CHATS = [[{"role": "user", "content": "Name three colours."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Qu'est-ce que c'est ? 🙂"},
          {"role": "assistant", "content": "Un test."}, {"role": "user", "content": "Encore"}]]


def _export(model: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("msa-eval")
    return subprocess.run([str(exe), "export-tokenizer", model, str(out), *flags], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def builtin_export(tmp_path_factory) -> Path:
    """The default model's tokenizer exported by the real CLI (a subprocess)."""
    out = tmp_path_factory.mktemp("export") / "tok"
    p = _export("smollm2-135m", out)
    assert p.returncode == 0, p.stderr
    return out


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """An HF directory of the default model's tokenizer (transformers' own GGUF conversion) and config."""
    from engine.loader.resolve import resolve_model_path

    _, p = resolve_model_path("smollm2-135m", progress=False)
    d = tmp_path_factory.mktemp("hfdir")
    transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name).save_pretrained(d)
    cfg = transformers.AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name).to_dict()
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "quantization_config"}))
    return d


@pytest.mark.parametrize("source", ["builtin", "hf_dir"])
def test_autotokenizer_equals_the_engine_tokenizer(tmp_path, request, source):
    """Both sources: the built-in name through the real CLI, the HF directory through the click command
    in process (the same code, without a second interpreter start)."""
    from click.testing import CliRunner

    from engine.loader.resolve import load_tokenizer
    from msa_eval.cli import cli

    if source == "builtin":
        model, out = "smollm2-135m", request.getfixturevalue("builtin_export")
    else:
        model, out = str(request.getfixturevalue("hf_dir")), tmp_path / "tok"
        result = CliRunner().invoke(cli, ["export-tokenizer", model, str(out)])
        assert result.exit_code == 0, result.output
    loaded = load_tokenizer(model, progress=False)
    ours = loaded.tokenizer
    assert sorted(x.name for x in out.iterdir()) == ["special_tokens_map.json", "tokenizer.json",
                                                     "tokenizer_config.json"]
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert (hf.bos_token, hf.eos_token) == (ours.bos_token, ours.eos_token)
    assert hf.model_max_length == loaded.config.max_position == 8192
    for text in TEXTS:
        ids = ours.encode(text)
        assert hf(text, add_special_tokens=False)["input_ids"] == ids, text
        assert hf(text)["input_ids"] == ours.encode(text, add_special_tokens=True), text
        assert hf.decode(ids) == ours.decode(ids, skip_special_tokens=False) == text
        assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids, skip_special_tokens=True), text
    for chat in CHATS:
        for gen in (True, False):
            text = ours.apply_chat_template(chat, add_generation_prompt=gen)
            assert hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == text
            assert hf.apply_chat_template(chat, add_generation_prompt=gen, return_dict=True)["input_ids"] == \
                ours.encode(text)


def test_an_existing_export_is_refused_without_force(tmp_path):
    """A DIR holding tokenizer files: one line naming --force, the files left alone; --force replaces them."""
    out = tmp_path / "tok"
    out.mkdir()
    config = out / "tokenizer_config.json"
    config.write_text("{}")
    p = _export("smollm2-135m", out)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "pass --force" in p.stderr
    assert config.read_text() == "{}" and not (out / "tokenizer.json").exists()  # left alone
    from click.testing import CliRunner

    from msa_eval.cli import cli

    assert CliRunner().invoke(cli, ["export-tokenizer", "smollm2-135m", str(out), "--force"]).exit_code == 0
    assert json.loads(config.read_text())["eos_token"] == "<|im_end|>" and (out / "tokenizer.json").is_file()


def test_a_tokenizer_that_adds_bos_exports_a_post_processor_that_adds_it(tmp_path):
    """A model whose tokenizer adds BOS to plain prompts (Llama-style GGUFs and HF configs with add_bos_token):
    AutoTokenizer on the export adds it exactly where `encode(text, add_special_tokens=True)` does."""
    from engine.loader.resolve import load_tokenizer
    from engine.tokenizer import Tokenizer
    from engine.tokenizer_export import write_hf_tokenizer

    base = load_tokenizer("smollm2-135m", progress=False).tokenizer
    ours = Tokenizer(base._tok, base.chat_template, base.bos_token, base.eos_token, base.eos_token_ids, add_bos=True)
    write_hf_tokenizer(ours, tmp_path, 8192)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS[:5]:
        ids = ours.encode(text, add_special_tokens=True)
        assert ids[0] == ours.bos_token_id and hf(text)["input_ids"] == ids
        assert hf(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
