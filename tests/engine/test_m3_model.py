"""MiniMax-M3 in the engine against transformers' own `MiniMaxM3SparseForConditionalGeneration` (the
executable reference), on tiny random checkpoints it wrote with `save_pretrained` and our loader read
back: fp32 on the CPU, prompts long enough (1100 tokens = 9 blocks of 128, top-4 blocks) to be sparse."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from engine import LLM, SamplingParams
from engine.errors import UnsupportedModelError
from engine.m3.testing import build_reference, text_config, write_checkpoint
from engine.testing import all_logits

TC = text_config(num_layers=4)  # full / sparse / full / sparse attention; dense, MoE, MoE, MoE MLPs


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(10, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("m3")
    return d, write_checkpoint(d, TC)


def _llm(path, attention: str) -> LLM:
    return LLM(str(path), attention=attention, device="cpu", max_model_len=4096, kv_cache_tokens=16384, progress=False)


@pytest.fixture(scope="module")
def llm_msa(ckpt):
    return _llm(ckpt[0], "msa")


@pytest.fixture(scope="module")
def ref_logits(ckpt):
    ids = _ids(1100, 0)
    with torch.no_grad():
        return ids, ckpt[1](torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("kind", ["msa", "msa-ref"])
def test_logits_match_transformers(ckpt, llm_msa, ref_logits, kind):
    llm = llm_msa if kind == "msa" else _llm(ckpt[0], kind)
    ids, ref = ref_logits
    ours = all_logits(llm, ids)
    assert _rel(ours, ref) <= 1e-4, (kind, _rel(ours, ref))


def test_sparse_layers_really_select(ckpt, llm_msa, ref_logits):
    """The prompt is long enough that MSA drops blocks: its logits differ from full attention's."""
    ids, ref = ref_logits
    dense = all_logits(_llm(ckpt[0], "dense"), ids)
    assert _rel(dense, ref) > 1e-3


def test_dense_kind_equals_transformers_with_every_layer_full(ckpt):
    """`--attention dense` on M3 = transformers with every layer's layer_type full_attention, same weights."""
    path, ref = ckpt
    full = build_reference(dict(TC, layer_types=["full_attention"] * 4))
    missing, unexpected = full.load_state_dict(ref.state_dict(), strict=False)
    assert not missing and all("indexer" in k for k in unexpected)
    ids = _ids(900, 1)
    with torch.no_grad():
        want = full(torch.tensor([ids])).logits[0].float()
    assert _rel(all_logits(_llm(path, "dense"), ids), want) <= 1e-4


def test_all_full_attention_checkpoint(tmp_path):
    tc = text_config(num_layers=2, layer_types=["full_attention"] * 2)
    ref = write_checkpoint(tmp_path, tc, seed=3)
    ids = _ids(600, 2)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    llm = _llm(tmp_path, "msa")  # no sparse layer: MSA has nothing to select, every layer is dense
    assert llm.msa is not None and not llm.engine.attention.msa_layers
    assert _rel(all_logits(llm, ids), want) <= 1e-4


def test_32_greedy_tokens_match_transformers(ckpt, llm_msa):
    ids = _ids(700, 4)
    ours = llm_msa.generate(ids, SamplingParams(max_tokens=32, ignore_eos=True))[0].token_ids
    with torch.no_grad():
        want = ckpt[1].generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert ours == want[0, len(ids):].tolist()


def test_index_selections_equal_transformers_indexer(ckpt, llm_msa):
    """Per sparse layer: our index branch + the kernels' reference selection == transformers'
    `MiniMaxM3VLIndexer` output, as sets per (query, KV group); near-ties (the k-th and the next
    block within fp32 noise) excepted."""
    from engine.m3.model import PartialIndexRope
    from kernels.indexer import msa_indexer
    from kernels.indexer.naive import request_block_scores

    _, ref = ckpt
    model = llm_msa.model
    S, B, k = 1100, 128, TC["index_topk_blocks"]
    h = torch.randn(S, TC["hidden_size"], generator=torch.Generator().manual_seed(5))
    pos = torch.arange(S)
    lm = ref.model.language_model
    with torch.no_grad():
        cos_t, sin_t = lm.rotary_emb(h[None], pos[None])
        cos, sin = model.rope(pos)
        checked = 0
        for i in model.cfg.m3.sparse_layers:
            theirs = lm.layers[i].self_attn.indexer(h[None], (cos_t, sin_t), None, pos[None])[0]  # [H, S, k]
            q_idx, k_idx = model.index[i](h, PartialIndexRope(), cos, sin, pos)
            n_pages = -(-S // B)
            kc = torch.zeros(n_pages * B, k_idx.shape[-1])
            kc[:S] = k_idx
            ours = msa_indexer(q_idx, kc.view(n_pages, B, -1), torch.arange(n_pages, dtype=torch.int32)[None],
                               torch.tensor([0, S], dtype=torch.int32), torch.tensor([S], dtype=torch.int32), k,
                               impl="torch")
            scores = request_block_scores(q_idx, k_idx, B)  # [S, H, blocks]
            for t in range(S):
                for g in range(q_idx.shape[1]):
                    a = {int(x) for x in ours[t, g] if x >= 0}
                    b = {int(x) for x in theirs[g, t] if x >= 0}
                    if a != b:  # only a near-tie may differ: the blocks swapped score within fp32 noise
                        s = scores[t, g]
                        gap = (s[sorted(a - b)].min() - s[sorted(b - a)].max()).abs().item()
                        assert gap <= 1e-5 * s[s.isfinite()].abs().max().item(), (i, t, g, a, b)
                    checked += 1
    assert checked == S * q_idx.shape[1] * len(model.cfg.m3.sparse_layers)


def test_batched_equals_alone(llm_msa):
    prompts = [_ids(n, 10 + n) for n in (300, 650, 1000)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    together = [o.token_ids for o in llm_msa.generate(prompts, params)]
    alone = [llm_msa.generate(p, params)[0].token_ids for p in prompts]
    assert together == alone


@pytest.mark.parametrize("chunk", [128, 300])
def test_chunked_prefill_equals_one_shot(llm_msa, chunk):
    ids = _ids(1000, 6)
    one = all_logits(llm_msa, ids)
    assert torch.allclose(all_logits(llm_msa, ids, chunk=chunk), one, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("override, fix", [
    ({"index_local_blocks": 2}, "index_local_blocks 1"),
    ({"index_n_heads": 1}, "one index head per KV group"),
])
def test_unsupported_settings_are_one_line_errors(tmp_path, override, fix):
    write_checkpoint(tmp_path, text_config(num_layers=2, **override))
    with pytest.raises(UnsupportedModelError, match=fix):
        _llm(tmp_path, "msa")


def test_fp8_block_checkpoint(ckpt, llm_msa, ref_logits, tmp_path):
    """The checkpoint re-saved in the block-FP8 format (e4m3 + weight_scale_inv per 128x128 block): our model
    on it equals our model on the same weights dequantised by hand (the format is read exactly), and stays
    within FP8's precision of the original (e4m3 keeps 3 mantissa bits: ~6% per weight)."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    from engine.m3.fp8 import dequantize_fp8_blocks, quantize_fp8_blocks, write_fp8_checkpoint
    from engine.m3.names import is_projection

    src = ckpt[0]
    fp8 = write_fp8_checkpoint(src, tmp_path / "fp8")
    by_hand = tmp_path / "dequantised"
    shutil.copytree(src, by_hand)
    for f in by_hand.glob("*.safetensors"):
        with safe_open(str(f), "pt") as h:
            tensors = {k: h.get_tensor(k) for k in h.keys()}
        for k, t in tensors.items():
            if is_projection(k.removeprefix("language_model.")) and t.dim() == 2:
                tensors[k] = dequantize_fp8_blocks(*quantize_fp8_blocks(t)).to(t.dtype)
        save_file(tensors, str(f), metadata={"format": "pt"})
    ids, ref = ref_logits
    ours = all_logits(_llm(fp8, "msa"), ids)
    assert _rel(ours, all_logits(_llm(by_hand, "msa"), ids)) <= 1e-6
    rel = _rel(ours, ref)
    assert 1e-3 < rel <= 0.12, rel  # really quantised, and within FP8's precision
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.85
