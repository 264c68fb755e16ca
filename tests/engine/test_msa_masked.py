"""The CPU `--attention msa` path (masked SDPA) against the kernels' torch reference."""
import torch

from engine import LLM, SamplingParams
from engine.attention.meta import AttentionMeta
from engine.attention.msa_masked import masked_sparse_attention
from kernels.indexer.naive import indexer_paged_reference
from kernels.sparse_prefill.naive import sparse_attention_reference


def _batch(q_lens, kv_lens, B, n_pages, seed):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_pages, generator=g).tolist()  # scattered, non-identity pages
    lists, cu = [], [0]
    for kl in kv_lens:
        n = -(-kl // B)
        lists.append([perm.pop() for _ in range(n)])
    for ql in q_lens:
        cu.append(cu[-1] + ql)
    pt = torch.full((len(kv_lens), max(map(len, lists))), -1, dtype=torch.int32)
    for r, p in enumerate(lists):
        pt[r, :len(p)] = torch.tensor(p, dtype=torch.int32)
    meta = AttentionMeta(torch.tensor(cu, dtype=torch.int32), torch.tensor(kv_lens, dtype=torch.int32), pt,
                         torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), list(q_lens),
                         list(kv_lens), lists)
    return meta, g


def test_masked_equals_reference_on_awkward_shapes():
    for (hq, hkv, d, B, k) in [(9, 3, 64, 64, 4), (16, 1, 32, 16, 2), (8, 8, 16, 16, 3)]:
        q_lens, kv_lens = [37, 1, 70, 5], [37, 130, 200, 9]  # whole prompt, decode, chunk after prefix, < B
        meta, g = _batch(q_lens, kv_lens, B, 64, seed=hq + B)
        T = sum(q_lens)
        q = torch.randn(T, hq, d, generator=g)
        kc, vc = torch.randn(64, hkv, B, d, generator=g), torch.randn(64, hkv, B, d, generator=g)
        kic = torch.randn(64, B, 8, generator=g)
        ids = indexer_paged_reference(torch.randn(T, hkv, 8, generator=g), kic, meta.page_table,
                                      meta.cu_seqlens_q, meta.seq_lens_kv, k)
        ref = sparse_attention_reference(q, kc, vc, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, ids,
                                         scale=d ** -0.5)
        ref = ref[0] if isinstance(ref, tuple) else ref
        got = masked_sparse_attention(q, kc, vc, meta, ids, d ** -0.5, B)
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_msa_cpu_path_matches_msa_ref_greedy(tmp_path):
    """End to end on the real model with the shipped indexer at top-k 4 of 9 blocks (real, partial selections)."""
    ids = LLM("smollm2-135m", attention="dense", device="cpu", progress=False, kv_cache_tokens=2048)._to_ids(
        "The lighthouse keeper climbed the stairs every evening to light the lamp. " * 80)[:1100]
    p = SamplingParams(max_tokens=8, ignore_eos=True)
    out = {}
    for kind in ("msa", "msa-ref"):
        llm = LLM("smollm2-135m", attention=kind, device="cpu", progress=False, kv_cache_tokens=2048,
                  msa_overrides={"topk": 4})  # 4 of 9 blocks
        o = llm.generate([ids], p)[0]
        assert o.metrics["attention_density"] < 0.75
        out[kind] = o.token_ids
    assert out["msa"] == out["msa-ref"]
