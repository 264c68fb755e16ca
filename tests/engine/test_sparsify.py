"""`sparsify` on a tiny randomly initialised Llama: the KL objective decreases, the backbone stays
bitwise unchanged, the adapter loads into the engine, resume and bad settings behave."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

WORDS = ("alpha beta gamma delta river stone cloud paper window garden music silver orange yellow "
         "north south quick slow bright dark seven eleven table chair answer question").split()


def corpus_text(seed: int, n_words: int = 6000) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def make_tiny_llama(path: Path, seed: int = 0, layers: int = 3, heads: int = 4, kv_heads: int = 2) -> Path:
    """A random Llama-family HF folder (head dim 64, GQA 2) with a small byte-level BPE tokenizer."""
    from safetensors.torch import save_file
    from tokenizers import ByteLevelBPETokenizer

    path.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([corpus_text(1, 2000)], vocab_size=320, min_frequency=1, special_tokens=["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    vocab, hidden, d, inter = tok.get_vocab_size(), 128, 64, 256
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": d,
           "intermediate_size": inter, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 1}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    g = torch.Generator().manual_seed(seed)
    w = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g) * 0.5,
         "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(hidden)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
        w[p + "self_attn.q_proj.weight"] = torch.randn(heads * d, hidden, generator=g) * 0.3
        w[p + "self_attn.k_proj.weight"] = torch.randn(kv_heads * d, hidden, generator=g) * 0.3
        w[p + "self_attn.v_proj.weight"] = torch.randn(kv_heads * d, hidden, generator=g) * 0.1
        w[p + "self_attn.o_proj.weight"] = torch.randn(hidden, heads * d, generator=g) * 0.05
        w[p + "mlp.gate_proj.weight"] = torch.randn(inter, hidden, generator=g) * 0.1
        w[p + "mlp.up_proj.weight"] = torch.randn(inter, hidden, generator=g) * 0.1
        w[p + "mlp.down_proj.weight"] = torch.randn(hidden, inter, generator=g) * 0.05
    save_file(w, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    model = make_tiny_llama(root / "model")
    data = root / "corpus.txt"
    data.write_text(corpus_text(2))
    return model, data


def tiny_cfg(model: Path, data: Path, out: Path, **kw):
    from engine.sparsify import SparsifyConfig

    base = dict(model=str(model), out=str(out), block_size=64, topk=4, dense_layers=(0,), tokens=1024, seq_len=512,
                warmup_steps=12, steps=6, queries=48, lr=5e-3, seed=3, data=(str(data),), eval_queries=96,
                device="cpu")
    base.update(kw)
    return SparsifyConfig(**base)


def test_objective_decreases_backbone_frozen_adapter_loads(tiny, tmp_path):
    from engine import LLM, SamplingParams
    from engine.sparsify import sparsify

    model, data = tiny
    llm = LLM(str(model), device="cpu", dtype=torch.float32, kv_cache_tokens=1024, progress=False)
    before = {k: v.detach().clone() for k, v in llm.model.state_dict().items()}
    prov = sparsify(tiny_cfg(model, data, tmp_path / "ad"), progress=False, llm=llm)
    after = llm.model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before), "backbone weights changed"
    assert all(p.grad is None for p in llm.model.parameters())
    assert set(prov["layers"]) == {"1", "2"}
    for v in prov["layers"].values():  # held-out dense KL and the training loss both go down
        assert v["kl_dense_after"] < v["kl_dense_before"]
        assert v["loss_last"] < v["loss_first"]
        assert 0.0 < v["recall_after"] <= 1.0 + 1e-6
    for f in ("indexer.safetensors", "msa_config.json", "provenance.json"):
        assert (tmp_path / "ad" / f).is_file()
    assert not (tmp_path / "ad" / ".checkpoint").exists()
    msa = LLM(f"{model}+{tmp_path / 'ad'}", attention="msa", device="cpu", kv_cache_tokens=1024, progress=False)
    assert msa.msa.block_size == 64 and msa.msa.topk == 4 and msa.cache.page_size == 64
    ids = [int(x) for x in torch.randint(2, 300, (400,), generator=torch.Generator().manual_seed(0))]
    out = msa.generate([ids], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert 0 < out.metrics["attention_density"] < 1


def test_resume_skips_finished_layers_and_refuses_other_settings(tiny, tmp_path):
    from engine.loader import load
    from engine.msa import AdapterError, IndexProjections, MSAConfig
    from engine.sparsify import sparsify
    from engine.sparsify.trainer import CKPT, _save_checkpoint

    model, data = tiny
    cfg = tiny_cfg(model, data, tmp_path / "ad", warmup_steps=2, steps=1)
    ld = load(str(model), progress=False)
    proj = IndexProjections(ld.config, MSAConfig(block_size=64, topk=4, d_idx=64, dense_layers=(0,)))
    done = {"1": {"recall_before": 0.5, "recall_after": 0.75, "kl_dense_before": 1.0, "kl_dense_after": 0.5,
                  "loss_first": 1.0, "loss_last": 0.5, "seconds": 0.0}}
    _save_checkpoint(tmp_path / "ad", cfg, proj, done)
    prov = sparsify(cfg, progress=False, log=lambda m: None)
    assert prov["resumed"] and prov["layers"]["1"]["recall_after"] == 0.75  # layer 1 was not retrained
    assert prov["layers"]["2"]["loss_first"] > 0 and prov["layers"]["2"]["loss_first"] != 1.0  # trained now
    _save_checkpoint(tmp_path / "other", cfg, proj, done)
    with pytest.raises(AdapterError, match="other settings"):
        sparsify(tiny_cfg(model, data, tmp_path / "other", seed=4), progress=False)
    assert (tmp_path / "other" / CKPT).is_dir()


def test_cli_sparsify_bad_input_one_line(tiny, tmp_path):
    from click.testing import CliRunner

    from msa_eval.cli import cli

    model, data = tiny
    r = CliRunner().invoke(cli, ["sparsify", "--model", str(model), "--out", str(tmp_path / "a"), "--seq-len", "512",
                                 "--tokens", "100000", "--data", str(data)])
    assert r.exit_code != 0 and "calibration data has" in str(r.exception)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    r = CliRunner().invoke(cli, ["sparsify", "--model", str(gpt2), "--out", str(tmp_path / "b")])
    assert r.exit_code != 0 and "not supported" in str(r.exception) and "\n" not in str(r.exception)


def test_max_teacher_keeps_a_single_heads_key_mean_divides_it():
    from engine.sparsify.objective import teacher_probs

    # one group of 3 heads over 6 keys: heads 0, 1 read key 0; head 2 alone reads key 4
    logits = torch.full((1, 1, 3, 6), -20.0)
    logits[0, 0, 0, 0] = logits[0, 0, 1, 0] = logits[0, 0, 2, 4] = 20.0
    support = torch.ones(1, 1, 6, dtype=torch.bool)
    mean, mx = teacher_probs(logits, support, "mean"), teacher_probs(logits, support, "max")
    assert torch.allclose(mean.sum(-1), torch.ones(1, 1)) and torch.allclose(mx.sum(-1), torch.ones(1, 1))
    assert mean[0, 0, 4] == pytest.approx(1 / 3, abs=1e-4) and mx[0, 0, 4] == pytest.approx(0.5, abs=1e-4)
    support[..., 4] = False  # off the support: no mass; head 2 turns uniform (0.2) over the 5 left keys
    mx = teacher_probs(logits, support, "max")
    assert mx[0, 0, 4] == 0 and mx[0, 0, 0] == pytest.approx(1 / 1.8, abs=1e-4)
    assert mx[0, 0, 1] == pytest.approx(0.2 / 1.8, abs=1e-4)
    with pytest.raises(ValueError, match="mean"):
        teacher_probs(logits, support, "median")


def test_far_mass_is_the_largest_head_mass_before_the_own_block():
    from engine.sparsify.objective import far_mass, head_logits

    g = torch.Generator().manual_seed(0)
    k = torch.randn(256, 1, 64, generator=g)
    q = torch.zeros(2, 2, 64)
    q[0, 1] = k[10, 0] * 4  # query at 200 (own block 128..255): head 1 reads key 10, far away
    q[1, 1] = k[199, 0] * 4  # query at 200: head 1 reads key 199, inside its own block
    fm = far_mass(head_logits(q, k, torch.tensor([200, 200])), torch.tensor([200, 200]), 128)
    assert fm[0] > 0.95 and fm[1] < 0.7  # head 0 is uniform over 201 keys: 128/201 of it is far


def test_with_recurrences_copies_earlier_spans_far_back():
    from engine.sparsify.corpus import with_recurrences

    ids = list(range(10_000, 14_096))
    out = with_recurrences(ids, 0.2, seed=1, min_gap=256)
    changed = [i for i, (a, b) in enumerate(zip(ids, out, strict=True)) if a != b]
    assert len(out) == len(ids) and 0.15 * len(ids) <= len(changed) <= 0.25 * len(ids)
    for i in changed:  # every overwritten token is an original token from at least 256 positions earlier
        assert ids.index(out[i]) <= i - 256
    assert with_recurrences(ids, 0.2, seed=1, min_gap=256) == out and with_recurrences(ids, 0.0, 1, 256) == ids


def test_needle_probe_hits_when_the_indexer_scores_the_needle_block():
    from engine.sparsify.probe import block_hits, probe, span_blocks

    assert span_blocks((130, 140), 64).tolist() == [2] and span_blocks((120, 140), 64).tolist() == [1, 2]
    g = torch.Generator().manual_seed(1)
    S, B = 1024, 64
    k = torch.randn(S, 2, 64, generator=g) * 0.1
    k_idx = torch.randn(S, 64, generator=g) * 0.1
    pos = torch.tensor([1000, 1010])
    q = torch.zeros(2, 4, 64)
    q[:, 0] = k[300, 0] * 500  # head 0 of group 0 reads the needle token 300 (block 4)
    q_idx = torch.zeros(2, 2, 64)
    q_idx[:, 0] = k_idx[300] * 200  # group 0's index query finds it; group 1's scores another token
    q_idx[:, 1] = k_idx[40] * 200
    res = probe(q, k, q_idx, k_idx, pos, (298, 305), B, topk=2)  # 1 history block + the own one
    assert res.hit.tolist() == [[True, False], [True, False]]
    assert (res.needle_mass[:, 0, 0] > 0.99).all() and (res.needle_mass[:, 1] < 0.2).all()
    assert (res.selected_mass[:, 0, 0] > 0.99).all()
    sel = torch.zeros(1, 1, 16, dtype=torch.bool)
    sel[0, 0, [4, 5]] = True
    assert block_hits(sel, torch.tensor([4, 5])).item() and not block_hits(sel, torch.tensor([5, 6])).item()
    with pytest.raises(ValueError, match="after the needle"):
        probe(q, k, q_idx, k_idx, torch.tensor([100, 1000]), (298, 305), B, topk=2)


def test_sparsify_max_teacher_long_range_recurrence_trains(tiny, tmp_path):
    from engine.sparsify import sparsify

    model, data = tiny
    prov = sparsify(tiny_cfg(model, data, tmp_path / "ad", teacher="max", long_range=0.5, recurrence=0.2),
                    progress=False)
    assert prov["settings"]["teacher"] == "max" and prov["data"]["recurrence"] == 0.2
    for v in prov["layers"].values():
        assert v["loss_last"] < v["loss_first"] and v["kl_dense_after"] < v["kl_dense_before"]
    with pytest.raises(ValueError, match="--teacher"):
        tiny_cfg(model, data, tmp_path / "x", teacher="median")


def test_oracle_probe_selects_the_heaviest_blocks_and_bounds_an_indexer():
    from engine.sparsify.probe import probe

    g = torch.Generator().manual_seed(2)
    S, B = 1024, 64
    k = torch.randn(S, 1, 64, generator=g)
    pos = torch.tensor([900, 1000])
    q = torch.randn(2, 3, 64, generator=g) * 0.3
    orc = probe(q, k, None, None, pos, (100, 110), B, topk=4)
    ix = probe(q, k, torch.randn(2, 1, 64, generator=g), torch.randn(S, 64, generator=g), pos, (100, 110), B, topk=4)
    # the oracle picks by the group-mean mass, so its mean recall over the group is the best possible
    assert (orc.selected_mass.mean(-1) >= ix.selected_mass.mean(-1) - 1e-6).all()
    assert torch.equal(orc.needle_mass, ix.needle_mass)


def test_layers_train_independently_so_keep_dense_equals_a_run_with_more_dense_layers(tiny, tmp_path):
    """`keep_dense(adapter, [2])` is byte for byte the adapter of a run with layer 2 dense too."""
    from safetensors.torch import load_file

    from engine import LLM
    from engine.msa import AdapterError
    from engine.sparsify import sparsify
    from engine.sparsify.subset import keep_dense

    model, data = tiny
    kw = dict(warmup_steps=4, steps=2, teacher="max", long_range=0.5, recurrence=0.2)
    full = sparsify(tiny_cfg(model, data, tmp_path / "full", **kw), command="msa-eval sparsify --out full --seed 3",
                    progress=False)
    sub = sparsify(tiny_cfg(model, data, tmp_path / "sub", dense_layers=(0, 2), **kw), progress=False)
    derived = keep_dense(tmp_path / "full", [2], tmp_path / "derived")
    a, b = load_file(str(tmp_path / "sub" / "indexer.safetensors")), load_file(
        str(tmp_path / "derived" / "indexer.safetensors"))
    assert a.keys() == b.keys() == {"layers.1.wq", "layers.1.wk"}
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert set(load_file(str(tmp_path / "full" / "indexer.safetensors"))) > set(a)  # the source had layer 2
    assert derived["msa"] == sub["msa"] and derived["settings"] == sub["settings"]
    assert derived["layers"]["1"]["recall_after"] == sub["layers"]["1"]["recall_after"] != full["layers"]["2"][
        "recall_after"]
    assert derived["command"] == "msa-eval sparsify --out full --seed 3 --dense-layers 0,2"
    assert derived["derived"]["dropped_layers"] == [2]
    llm = LLM(f"{model}+{tmp_path / 'derived'}", attention="msa", device="cpu", kv_cache_tokens=1024, progress=False)
    assert llm.msa.dense_layers == (0, 2)
    with pytest.raises(AdapterError, match="not MSA layers"):
        keep_dense(tmp_path / "full", [0], tmp_path / "x")
