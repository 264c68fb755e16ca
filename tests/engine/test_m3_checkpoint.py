"""MiniMax-M3 checkpoint reading on real files written by transformers (`engine.m3.testing.write_checkpoint`):
hub names and shapes, tensors as transformers saved them (also from its text-only internal layout), block
FP8 round trips and re-saved checkpoints, `msa-eval models info` from the headers only, and every bad input
as one line with nothing written in the msa-eval home."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.config import from_hf_config
from engine.errors import ModelIntegrityError, UnsupportedModelError
from engine.m3.checkpoint import open_checkpoint
from engine.m3.fp8 import dequantize_fp8_blocks, quantize_fp8_blocks, write_fp8_checkpoint
from engine.m3.names import checkpoint_tensors, is_projection
from engine.m3.testing import text_config, write_checkpoint

CLI = [sys.executable, "-m", "msa_eval.cli"]
PREFIX = "language_model."
TC = text_config()  # 4 layers: full / sparse alternating, dense MLP first, then MoE


def _cfg(path: Path):
    return from_hf_config(json.loads((path / "config.json").read_text()))


def _open(path: Path):
    return open_checkpoint(path, _cfg(path))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("m3ckpt")


@pytest.fixture(scope="module")
def hub(work):
    """(directory, transformers model) of the VL checkpoint in the hub layout, sharded."""
    path = work / "m3"
    return path, write_checkpoint(path, TC)


@pytest.fixture(scope="module")
def internal(work, hub):
    """The same text weights saved by transformers' text-only MiniMaxM3VLForCausalLM (its internal layout)."""
    from transformers import MiniMaxM3VLForCausalLM, MiniMaxM3VLTextConfig

    _, ref = hub
    model = MiniMaxM3VLForCausalLM(MiniMaxM3VLTextConfig(**TC))
    text = {f"model.{k}": v for k, v in ref.model.language_model.state_dict().items()}
    model.load_state_dict({**text, "lm_head.weight": ref.lm_head.weight})
    path = work / "m3-text"
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def fp8(work, hub):
    return write_fp8_checkpoint(hub[0], work / "m3-fp8")


def _headers(path: Path) -> dict[str, tuple[list[int], str]]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            for k in h.keys():
                s = h.get_slice(k)
                out[k] = (s.get_shape(), s.get_dtype())
    return out


def test_names_and_shapes_are_the_hub_layout(hub):
    path, _ = hub
    headers = _headers(path)
    text = {k[len(PREFIX):]: tuple(v[0]) for k, v in headers.items() if k.startswith(PREFIX)}
    assert checkpoint_tensors(_cfg(path)) == text
    assert not any(k.startswith("model.") for k in headers)


def test_tensors_are_transformers_state_fp32_exact_with_one_skip_line(hub, caplog):
    path, ref = hub
    with caplog.at_level(logging.INFO, logger="engine.m3.checkpoint"):
        ck = _open(path)
    lines = [r.getMessage() for r in caplog.records if r.name == "engine.m3.checkpoint"]
    skipped = [k for k in _headers(path) if not k.startswith(PREFIX)]
    assert len(lines) == 1 and f"skipped {len(skipped)} tensors" in lines[0] and "vision tower" in lines[0]
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        raw |= load_file(str(f))
    with ck:
        got = dict(ck.items())
        assert ck.names() == list(checkpoint_tensors(ck.cfg))  # model order; items() goes shard by shard
        assert sorted(got) == sorted(ck.names())
        for name, t in got.items():
            assert t.dtype == torch.float32 and torch.equal(t, raw[PREFIX + name]), name
            assert torch.equal(ck.tensor(name), t)
    sd = ref.state_dict()
    assert torch.equal(got["lm_head.weight"], sd["lm_head.weight"])
    assert torch.equal(got["model.layers.1.block_sparse_moe.experts.3.w2.weight"],
                       sd["model.language_model.layers.1.mlp.experts.down_proj"][3])
    text = [v for k, v in sd.items() if k.startswith("model.language_model.") or k == "lm_head.weight"]
    assert ck.parameter_count() == sum(v.numel() for v in text)


def test_transformers_text_only_layout_reads_as_the_hub_names(hub, internal):
    headers = _headers(internal)
    assert "model.layers.1.mlp.experts.gate_up_proj" in headers and "model.layers.0.mlp.gate_up_proj.weight" in headers
    assert "model.layers.1.self_attn.indexer.q_proj.weight" in headers
    with _open(hub[0]) as a, _open(internal) as b:
        assert b.names() == a.names()
        for name, t in b.items():
            assert torch.equal(t, a.tensor(name)), name  # transformers' own conversion made `a`
        assert b.parameter_count() == a.parameter_count()


def test_text_only_hub_names_in_one_file(hub, tmp_path):
    """A text-only directory (model_type minimax_m3_vl_text, no `language_model.` prefix, one model.safetensors)."""
    src, _ = hub
    raw: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        raw |= {k[len(PREFIX):]: v for k, v in load_file(str(f)).items() if k.startswith(PREFIX)}
    path = tmp_path / "text"
    path.mkdir()
    save_file(raw, str(path / "model.safetensors"), metadata={"format": "pt"})
    tc = json.loads((src / "config.json").read_text())["text_config"]
    (path / "config.json").write_text(json.dumps({**tc, "architectures": ["MiniMaxM3VLForCausalLM"]}))
    with _open(path) as ck, _open(src) as ref:
        assert ck.names() == ref.names()
        for name, t in ck.items():
            assert torch.equal(t, ref.tensor(name)), name


def test_fp8_round_trip_within_the_e4m3_step():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(300, 260, generator=gen) * torch.logspace(-4, 2, 300)[:, None]
    w[128:256, 128:256] = 0
    q, s = quantize_fp8_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (3, 3)
    back = dequantize_fp8_blocks(q, s)
    assert torch.equal(back[128:256, 128:256], torch.zeros(128, 128))
    amax = torch.zeros(3, 3)
    for i in range(3):
        for j in range(3):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax[i, j] = blk.abs().max()
            if amax[i, j] > 0:  # the block's largest value is e4m3's largest
                assert q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float().abs().max() == 448
    spread = amax.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :260]
    err = (back - w).abs()
    assert (err <= 2.0 ** -3 * spread).all()  # the e4m3 relative step of the block amax
    assert (err <= 2.0 ** -4 * w.abs() + 2.0 ** -10 * spread / 448 + 1e-30).all()  # half a step, subnormals
    assert err.max() > 0  # it is lossy: the bound is not vacuous
    with pytest.raises(ValueError, match="does not tile"):
        dequantize_fp8_blocks(q, s.T[:2])


def test_fp8_blocks_are_transformers_format():
    """Same q and scales as transformers' own block-FP8 quantizer, same dequantisation as its FP8 linear."""
    from types import SimpleNamespace

    from transformers.integrations.finegrained_fp8 import Fp8Quantize, _dequantize_fp8_weight

    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 1, 256)[:, None]
    w[:128, 128:256] = 0
    hf = SimpleNamespace(quantization_config=SimpleNamespace(weight_block_size=[128, 128], scale_fmt=None))
    theirs = Fp8Quantize(hf).convert({"x.weight": w})
    q, s = quantize_fp8_blocks(w)
    assert torch.equal(q.view(torch.uint8), theirs["x.weight"].view(torch.uint8))
    assert torch.equal(s, theirs["x.weight_scale_inv"])
    ragged_q, ragged_s = quantize_fp8_blocks(w[:200, :300])
    assert torch.equal(dequantize_fp8_blocks(ragged_q, ragged_s),
                       _dequantize_fp8_weight(ragged_q, ragged_s, [128, 128], torch.float32))


def test_fp8_checkpoint_reopens_within_fp8_tolerance(hub, fp8):
    src, _ = hub
    config = json.loads((fp8 / "config.json").read_text())
    assert config["quantization_config"] == {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                             "weight_block_size": [128, 128]}
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (fp8 / f).read_bytes() == (src / f).read_bytes()
    headers = _headers(fp8)
    assert headers["vision_tower.vision_model.pre_layrnorm.weight"][1] == "F32"
    with _open(src) as a, _open(fp8) as b:
        assert b.names() == a.names() and b.parameter_count() == a.parameter_count()
        n_fp8 = 0
        for name, t in b.items():
            ref = a.tensor(name)
            stored = headers[PREFIX + name][1]
            if is_projection(name):
                n_fp8 += 1
                assert stored == "F8_E4M3" and headers[PREFIX + name + "_scale_inv"][1] == "F32", name
                assert ((t - ref).abs() <= 2.0 ** -3 * ref.abs().max()).all(), name  # one block per tiny matrix
                assert not torch.equal(t, ref), name
            else:  # embeddings, lm_head, norms, router and bias keep their dtype and values
                assert stored == "F32" and torch.equal(t, ref), name
        assert b.stored_dtypes() == {"F8_E4M3": n_fp8, "F32": len(b.names()) - n_fp8}
    index = json.loads((fp8 / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(headers)
    assert [p.name for p in fp8.parent.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(FileExistsError):
        write_fp8_checkpoint(src, fp8)


def _transformers_view(sd: dict[str, torch.Tensor], name: str, cfg) -> torch.Tensor:
    """Hub tensor `name` cut out of transformers' in-memory state (fused gate_up, 3-D experts, indexer)."""
    if name == "lm_head.weight":
        return sd[name]
    key = "model.language_model." + name[len("model."):]
    key = key.replace("block_sparse_moe.e_score_correction_bias", "mlp.gate.e_score_correction_bias")
    key = key.replace("block_sparse_moe.", "mlp.").replace("self_attn.index_", "self_attn.indexer.")
    if m := re.fullmatch(r"(.*\.experts)\.(\d+)\.(w[123])\.weight", key):
        head, e, w = m.group(1), int(m.group(2)), m.group(3)
        n = cfg.m3.moe_intermediate_size
        return sd[head + ".down_proj"][e] if w == "w2" else sd[head + ".gate_up_proj"][e, (w == "w3") * n:][:n]
    if m := re.fullmatch(r"(.*)\.(gate|up)_proj\.weight", key):
        n = cfg.m3.shared_intermediate_size if "shared_experts" in key else cfg.m3.dense_intermediate_size
        return sd[m.group(1) + ".gate_up_proj.weight"][(m.group(2) == "up") * n:][:n]
    return sd[key]


def test_transformers_reads_the_fp8_checkpoint_as_we_do(fp8):
    """transformers' FP8 loader (dequantize=True) on the re-saved directory gives our reader's tensors."""
    from transformers import FineGrainedFP8Config, MiniMaxM3SparseForConditionalGeneration

    model = MiniMaxM3SparseForConditionalGeneration.from_pretrained(
        str(fp8), quantization_config=FineGrainedFP8Config(dequantize=True), dtype=torch.float32)
    sd = model.state_dict()
    with _open(fp8) as ck:
        for name, t in ck.items():
            assert torch.equal(t, _transformers_view(sd, name, ck.cfg)), name


def test_fp8_writer_leaves_nothing_when_a_shard_fails(hub, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(hub[0], src)
    last = sorted(src.glob("*.safetensors"))[-1]
    last.write_bytes(last.read_bytes()[:40])
    with pytest.raises(Exception):  # noqa: B017 - safetensors' own error type for a damaged file
        write_fp8_checkpoint(src, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# ---- bad input: one line naming the fix, nothing written in the msa-eval home ----

def _drop_tensor(path: Path, key: str) -> None:
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = path / index["weight_map"].pop(key)
    tensors = load_file(str(shard))
    del tensors[key]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))


def _edit_config(path: Path, **changes) -> None:
    c = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if k.startswith("text_"):
            c["text_config"][k[5:]] = v
        else:
            c[k] = v
    (path / "config.json").write_text(json.dumps(c))


def _shard(path: Path, i: int) -> Path:
    return sorted(path.glob("model-*.safetensors"))[i]


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:-100])


BAD = {
    "missing shard": (lambda p: _shard(p, 2).unlink(), ModelIntegrityError,
                      ["model-00003-of-", ".safetensors is missing", "download every shard"]),
    "truncated shard": (lambda p: _truncate(_shard(p, 1)), ModelIntegrityError, ["00002-of-", "is truncated"]),
    "missing tensor": (lambda p: _drop_tensor(p, PREFIX + "model.layers.3.self_attn.index_q_proj.weight"),
                       ModelIntegrityError, [("tensor language_model.model.layers.3.self_attn.index_q_proj.weight is "
                                             "missing"), "hub layout"]),
    "wrong shape": (lambda p: _edit_config(p, text_shared_intermediate_size=TC["shared_intermediate_size"] + 8),
                    ModelIntegrityError,
                    [("language_model.model.layers.1.block_sparse_moe.shared_experts.gate_proj.weight has shape "
                     f"[{TC['shared_intermediate_size']}, {TC['hidden_size']}] in the checkpoint but config.json makes "
                     f"it [{TC['shared_intermediate_size'] + 8}, {TC['hidden_size']}]")]),
    "unknown model_type": (lambda p: _edit_config(p, model_type="minimax_m4_vl"), UnsupportedModelError,
                           ["model_type 'minimax_m4_vl'", "MiniMax-M3"]),
    "unsupported quantization": (lambda p: _edit_config(p, quantization_config={"quant_method": "awq", "bits": 4}),
                                 UnsupportedModelError, ["quant_method 'awq' is not supported", "quant_method fp8"]),
    "fp8 blocks": (lambda p: _edit_config(p, quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                                                  "weight_block_size": [64, 64]}),
                   UnsupportedModelError, ["fp8 weight_block_size [64, 64] is not supported"]),
}


@pytest.fixture(scope="module")
def bad_dirs(work, hub):
    out = {}
    for name, (damage, _, _) in BAD.items():
        p = work / ("bad-" + name.replace(" ", "-"))
        shutil.copytree(hub[0], p)
        damage(p)
        out[name] = p
    return out


def _home_files(home: Path) -> list[Path]:
    return [p for p in home.rglob("*") if p.is_file()] if home.exists() else []


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_is_one_line(case, bad_dirs, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MSA_EVAL_HOME", str(home))
    _, error, parts = BAD[case]
    with pytest.raises(error) as e:
        _open(bad_dirs[case])
    msg = str(e.value)
    assert "\n" not in msg and all(p in msg for p in parts), msg
    assert _home_files(home) == []


def test_bad_checkpoints_through_the_cli(bad_dirs, tmp_path, monkeypatch, capsys):
    """`msa-eval models info BAD`: exit 2, one error line, no traceback; every case through the CLI's own
    entry point, two of them in a real subprocess too."""
    from msa_eval.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("MSA_EVAL_HOME", str(home))
    for case, path in bad_dirs.items():
        monkeypatch.setattr(sys, "argv", ["msa-eval", "models", "info", str(path)])
        with pytest.raises(SystemExit) as e:
            main()
        lines = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, lines)
        assert all(p in lines[0] for p in BAD[case][2]), (case, lines)
    for case in ("missing shard", "unsupported quantization"):
        r = subprocess.run([*CLI, "models", "info", str(bad_dirs[case])], capture_output=True, text=True,
                           env=dict(os.environ), timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, r.stderr)
        assert "Traceback" not in r.stderr and all(p in lines[0] for p in BAD[case][2]), (case, lines)
    assert _home_files(home) == []


# ---- models info ----

def test_models_info_json_from_config_and_headers(hub, fp8, tmp_path):
    path, ref = hub
    env = {**os.environ, "MSA_EVAL_HOME": str(tmp_path / "home")}
    r = subprocess.run([*CLI, "models", "info", str(path), "--json"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["family"] == "minimax_m3" and d["layers"] == 4
    assert d["attention"] == "full x2, sparse x2" and d["mlp"] == "dense x1, moe x3"
    assert d["layer_types"] == ["full_attention", "minimax_m3_sparse"] * 2
    assert d["mlp_layer_types"] == ["dense", "sparse", "sparse", "sparse"]
    assert d["experts"] == {"num_experts": TC["num_local_experts"], "top_k": TC["num_experts_per_tok"],
                            "moe_intermediate_size": TC["intermediate_size"],
                            "shared_intermediate_size": TC["shared_intermediate_size"],
                            "dense_intermediate_size": TC["dense_intermediate_size"], "routed_scaling_factor": 2.0}
    assert d["msa"] == {"index_heads": TC["index_n_heads"], "index_head_dim": TC["index_head_dim"],
                        "block_size": TC["index_block_size"], "topk_blocks": TC["index_topk_blocks"],
                        "local_blocks": 1, "sparse_layers": 2}
    assert d["quantization"] is None and d["stored_dtypes"] == {"F32": len(checkpoint_tensors(_cfg(path)))}
    text = [v for k, v in ref.state_dict().items() if k.startswith("model.language_model.") or k == "lm_head.weight"]
    assert d["parameters"] == sum(v.numel() for v in text)
    # bf16 (2 bytes): K and V of every layer, plus one index key on each of the 2 sparse layers
    kv = 2 * 4 * TC["num_key_value_heads"] * TC["head_dim"]
    assert d["kv_cache_bytes_per_token_bf16"] == 2 * (kv + 2 * TC["index_head_dim"])
    # fp8: 1 byte per element + a fp32 scale per token and KV head for K and for V; int8 index keys + a fp32 scale
    assert d["kv_cache_bytes_per_token_fp8"] == kv + 4 * 2 * 4 * TC["num_key_value_heads"] \
        + 2 * (TC["index_head_dim"] + 4)
    assert d["chat_template"] is True
    r = subprocess.run([*CLI, "models", "info", str(fp8)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "fp8 e4m3, 128x128 blocks" in r.stdout and "full x2, sparse x2" in r.stdout


def test_models_info_reads_no_tensor_data(hub, monkeypatch):
    """No safetensors data access and no weight loader: the real checkpoint is hundreds of GB."""
    import safetensors
    import safetensors.torch
    from click.testing import CliRunner

    import engine.loader
    from msa_eval.cli import cli

    def refuse(*a, **k):
        raise AssertionError("models info read tensor data")

    for mod, attr in ((safetensors, "safe_open"), (safetensors.torch, "load_file"), (engine.loader, "load")):
        monkeypatch.setattr(mod, attr, refuse)
    r = CliRunner().invoke(cli, ["models", "info", str(hub[0]), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["parameters"] > 0
