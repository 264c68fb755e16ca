"""`--attention msa-oracle`: MSA's block budget chosen by the true attention mass (engine/attention/oracle.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.attention.meta import AttentionMeta
from engine.attention.oracle import oracle_ids
from engine.msa.recall import selected_mass
from engine.testing import all_logits, decode_step_meta


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def stack():
    """A random 3-layer GQA stack (8 q / 2 KV heads of 64) with random index projections on every layer."""
    from engine.config import ModelConfig
    from engine.testing import random_model

    cfg = ModelConfig(arch="llama", vocab_size=1000, hidden_size=128, num_layers=3, num_heads=8, num_kv_heads=2,
                      head_dim=64, intermediate_size=256, max_position=4096)
    torch.manual_seed(0)
    return cfg, random_model(cfg, "cpu", torch.float32)


def _run(stack, kind: str, topk: int, ids: list[int]) -> torch.Tensor:
    from engine.attention import make_attention
    from engine.testing import random_engine, random_indexer

    cfg, model = stack
    torch.manual_seed(1)  # the same index projections for every kind
    indexer = random_indexer(cfg, "cpu", torch.float32, topk=topk) if kind != "dense" else None
    eng = random_engine(model, make_attention(kind, "cpu", cfg, indexer), "cpu", 4096,
                        index_dim=indexer.config.d_idx if indexer else 0,
                        index_layers=indexer.layers if indexer else ())
    return all_logits(SimpleNamespace(engine=eng, model=model, cache=eng.cache), ids)


def test_oracle_with_every_block_is_dense(stack):
    """5 blocks of 128 and top-8: the oracle keeps every block, so it is dense attention exactly."""
    ids = _ids(600, 0)
    assert torch.allclose(_run(stack, "msa-oracle", 8, ids), _run(stack, "dense", 8, ids), rtol=0, atol=1e-5)


def test_oracle_is_closer_to_dense_than_the_indexer(stack):
    ids = _ids(1100, 1)
    dense = _run(stack, "dense", 4, ids)

    def rel(kind: str) -> float:
        x = _run(stack, kind, 4, ids)
        return ((x - dense).norm() / dense.norm()).item()

    oracle, indexer = rel("msa-oracle"), rel("msa")
    assert 0 < oracle < indexer, (oracle, indexer)


def _meta(ql: int, kl: int, pages: int) -> AttentionMeta:
    z = torch.zeros(1, dtype=torch.int32)
    return AttentionMeta(cu_seqlens_q=z, seq_lens_kv=z, page_table=z, slot_pages=z, slot_offsets=z, q_lens=[ql],
                         kv_lens=[kl], page_lists=[list(range(pages))])


def test_oracle_ids_keep_the_most_mass_in_the_indexers_layout():
    g = torch.Generator().manual_seed(2)
    hq, hkv, d, B, S, k = 8, 2, 64, 128, 1000, 4
    pages = -(-S // B)
    kc = torch.randn(pages, hkv, B, d, generator=g)
    q = torch.randn(S, hq, d, generator=g) * 2
    meta = _meta(S, S, pages)
    ids = oracle_ids(q, kc, meta, k, d ** -0.5)
    pos = torch.arange(S)
    own = pos // B
    valid = (ids >= 0).sum(-1)
    assert torch.equal(valid, torch.clamp(own + 1, max=k)[:, None].expand(-1, hkv).to(valid.dtype))
    last = ids.gather(-1, (valid - 1).long()[..., None])[..., 0]
    assert torch.equal(last, own[:, None].expand(-1, hkv).to(last.dtype))  # the own block in the last valid slot
    assert int(ids.max()) < pages
    # no other choice of the same size keeps more mass: compare with random valid selections
    best, n = selected_mass(q, kc, meta, ids, d ** -0.5)
    for seed in range(3):
        r = torch.Generator().manual_seed(10 + seed)
        alt = ids.clone()
        for t in range(B * k, S, 97):  # tokens with more history blocks than slots
            hist = torch.randperm(int(own[t]), generator=r)[: k - 1].to(torch.int32)
            alt[t, :, : k - 1] = hist
        assert selected_mass(q, kc, meta, alt, d ** -0.5)[0] <= best + 1e-4
    assert 0 < best / n <= 1


@pytest.mark.parametrize("q_lens", [None, [1, 1, 90, 1, 1, 40]], ids=["decode", "mixed"])
@pytest.mark.parametrize("max_elements", [None, 1 << 16])  # one chunk of requests, or one request per chunk
def test_decode_step_scores_all_requests_at_once_like_one_at_a_time(monkeypatch, max_elements, q_lens):
    """A decode step (one query per request, scattered pages of unequal lengths), and a mixed step (prompt chunks
    beside the decode tokens, as continuous batching runs them), get the ids the per-request path gives each
    request alone."""
    from engine.msa import recall

    if max_elements:
        monkeypatch.setitem(recall.CHUNK_ELEMENTS, "cpu", max_elements)
    g = torch.Generator().manual_seed(3)
    hq, hkv, d, B, k = 8, 2, 64, 128, 4
    lens = [1, 130, 700, 1000, 511, 300]
    q_of = q_lens or [1] * len(lens)
    kc = torch.randn(40, hkv, B, d, generator=g)
    meta = decode_step_meta(lens, 40, B, g, q_lens=q_lens)
    lists, table, z = meta.page_lists, meta.page_table, meta.cu_seqlens_q
    q = torch.randn(sum(q_of), hq, d, generator=g) * 2
    got = oracle_ids(q, kc, meta, k, d ** -0.5)
    start = 0
    for r, (n, pl, ql) in enumerate(zip(lens, lists, q_of, strict=True)):
        one = AttentionMeta(cu_seqlens_q=z, seq_lens_kv=z, page_table=table[r:r + 1], slot_pages=z, slot_offsets=z,
                            q_lens=[ql], kv_lens=[n], page_lists=[pl], is_decode=ql == 1)
        assert torch.equal(got[start:start + ql], oracle_ids(q[start:start + ql], kc, one, k, d ** -0.5)), r
        start += ql
