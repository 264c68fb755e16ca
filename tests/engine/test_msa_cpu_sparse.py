"""The CPU `--attention msa` path: `cpu_indexer` and the block-sparse `msa_cpu` attention against the
kernels' fp32 references, on awkward shapes, and end to end against `msa-ref`."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.cpu_indexer import block_tiles, prefill_block_ids
from engine.attention.meta import AttentionMeta
from engine.attention.msa_cpu import sparse_attention
from kernels.decode.naive import decode_indexer_ref, sparse_decode_attention_ref
from kernels.indexer.naive import indexer_paged_reference
from kernels.sparse_prefill.naive import dense_causal_reference, sparse_attention_reference

N_PAGES = 96


def _batch(q_lens, kv_lens, B, seed, n_pages=N_PAGES):
    """Metadata of a packed batch whose requests sit on scattered pages (no identity page table)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_pages, generator=g).tolist()
    lists = [[perm.pop() for _ in range(-(-kl // B))] for kl in kv_lens]
    cu = [0]
    for ql in q_lens:
        cu.append(cu[-1] + ql)
    pt = torch.full((len(kv_lens), max(map(len, lists))), -1, dtype=torch.int32)
    for r, p in enumerate(lists):
        pt[r, :len(p)] = torch.tensor(p, dtype=torch.int32)
    meta = AttentionMeta(torch.tensor(cu, dtype=torch.int32), torch.tensor(kv_lens, dtype=torch.int32), pt,
                         torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), list(q_lens),
                         list(kv_lens), lists, is_decode=all(ql == 1 for ql in q_lens))
    return meta, g


def _tensors(meta, hq, hkv, d, B, g, d_idx=16):
    T = sum(meta.q_lens)
    q = torch.randn(T, hq, d, generator=g)
    kc, vc = torch.randn(N_PAGES, hkv, B, d, generator=g), torch.randn(N_PAGES, hkv, B, d, generator=g)
    kic = torch.randn(N_PAGES, B, d_idx, generator=g)
    q_idx = torch.randn(T, hkv, d_idx, generator=g)
    return q, kc, vc, kic, q_idx


def _reference(q, kc, vc, meta, ids):
    return sparse_attention_reference(q, kc, vc, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, ids,
                                      scale=q.shape[-1] ** -0.5)[0]


# (Hq, Hkv, d, B, k), (q_lens, kv_lens): whole prompts, a chunk after a prefix, decode rows, lengths below one
# block and not a multiple of it, several requests in one batch
SHAPES = [(9, 3, 64, 64, 4), (16, 1, 32, 16, 2), (8, 8, 16, 16, 3), (9, 3, 64, 16, 16), (4, 2, 16, 32, 8)]
BATCHES = [([37, 1, 70, 5], [37, 130, 200, 9]), ([300], [300]), ([129, 64], [640, 64]), ([1, 1, 1], [1, 200, 33])]


@pytest.mark.parametrize("shape", SHAPES)
def test_indexer_equals_reference(shape):
    hq, hkv, d, B, k = shape
    for q_lens, kv_lens in BATCHES:
        meta, g = _batch(q_lens, kv_lens, B, seed=hq + B + len(q_lens))
        _, _, _, kic, q_idx = _tensors(meta, hq, hkv, d, B, g)
        ref = indexer_paged_reference(q_idx, kic, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, k)
        assert torch.equal(prefill_block_ids(q_idx, kic, meta, k), ref), (shape, q_lens, kv_lens)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_indexer_on_int8_keys_equals_reference(shape):
    """An FP8 cache's int8 index keys (with their scales): the CPU selection is the reference's on them (keys
    dequantised, queries rounded to int8 per row), and not the one of the unquantised keys everywhere."""
    from kernels._common.int8 import quantize_int8_rows

    hq, hkv, d, B, k = shape
    differs = 0
    for q_lens, kv_lens in BATCHES:
        meta, g = _batch(q_lens, kv_lens, B, seed=hq + B + len(q_lens))
        _, _, _, kic, q_idx = _tensors(meta, hq, hkv, d, B, g)
        k8, scale = quantize_int8_rows(kic)
        args = (meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, k)
        ref = indexer_paged_reference(q_idx, k8, *args, k_idx_scale=scale)
        assert torch.equal(prefill_block_ids(q_idx, k8, meta, k, scale), ref), (shape, q_lens, kv_lens)
        differs += int(not torch.equal(ref, indexer_paged_reference(q_idx, kic, *args)))
    assert differs  # random keys and queries: the int8 rounding moves some near-tie selection


def test_block_tiles_cover_the_queries_once():
    for ql, kl, B in [(37, 37, 16), (70, 200, 64), (1, 130, 64), (300, 300, 128), (64, 64, 64)]:
        tiles = block_tiles(ql, kl, B)
        assert tiles[0][0] == 0 and tiles[-1][1] == ql
        assert all(a1 == b0 for (_, a1, _), (b0, _, _) in zip(tiles, tiles[1:], strict=False))
        for a, b, own in tiles:  # every query of a tile sits in the tile's own block
            assert {(kl - ql + i) // B for i in range(a, b)} == {own}


@pytest.mark.parametrize("shape", SHAPES)
def test_sparse_attention_equals_reference(shape):
    hq, hkv, d, B, k = shape
    for q_lens, kv_lens in BATCHES:
        meta, g = _batch(q_lens, kv_lens, B, seed=7 * hq + B)
        q, kc, vc, kic, q_idx = _tensors(meta, hq, hkv, d, B, g)
        ids = indexer_paged_reference(q_idx, kic, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, k)
        got = sparse_attention(q, kc, vc, meta, ids, d ** -0.5)
        torch.testing.assert_close(got, _reference(q, kc, vc, meta, ids), rtol=1e-5, atol=2e-6)


def test_arbitrary_selections_equal_reference():
    """Ids the indexer would not give: any subset of the visible blocks (without the own block, or empty), in
    any slots with -1 holes between them."""
    hq, hkv, d, B, k = 6, 2, 32, 16, 5
    meta, g = _batch([90, 1, 33], [200, 77, 33], B, seed=3)
    q, kc, vc, _, _ = _tensors(meta, hq, hkv, d, B, g)
    ids = torch.full((q.shape[0], hkv, k), -1, dtype=torch.int32)
    t = 0
    for ql, kl in zip(meta.q_lens, meta.kv_lens, strict=True):
        for i in range(ql):
            own = (kl - ql + i) // B
            for h in range(hkv):
                n = int(torch.randint(0, min(k, own + 1) + 1, (1,), generator=g))
                slots = torch.randperm(k, generator=g)[:n]
                ids[t + i, h, slots] = torch.randperm(own + 1, generator=g)[:n].to(torch.int32)
        t += ql
    assert (ids < 0).all(-1).any() and (ids >= 0).sum() > q.shape[0]
    got = sparse_attention(q, kc, vc, meta, ids, d ** -0.5)
    torch.testing.assert_close(got, _reference(q, kc, vc, meta, ids), rtol=1e-5, atol=2e-6)


def test_every_block_selected_is_dense():
    hq, hkv, d, B, k = 9, 3, 64, 16, 16  # top-k >= the number of blocks of every request
    meta, g = _batch([100, 1, 40], [100, 250, 40], B, seed=11)
    q, kc, vc, kic, q_idx = _tensors(meta, hq, hkv, d, B, g)
    ids = prefill_block_ids(q_idx, kic, meta, k)
    dense = dense_causal_reference(q, kc, vc, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, scale=d ** -0.5)
    torch.testing.assert_close(sparse_attention(q, kc, vc, meta, ids, d ** -0.5), dense, rtol=1e-5, atol=2e-6)


def test_empty_selection_is_zero():
    hq, hkv, d, B = 4, 2, 16, 16
    for q_lens, kv_lens in [([50], [80]), ([1, 1], [40, 3]), ([20, 1], [20, 60])]:
        meta, g = _batch(q_lens, kv_lens, B, seed=5)
        q, kc, vc, _, _ = _tensors(meta, hq, hkv, d, B, g)
        ids = torch.full((q.shape[0], hkv, 4), -1, dtype=torch.int32)
        got = sparse_attention(q, kc, vc, meta, ids, d ** -0.5)
        assert torch.equal(got, torch.zeros_like(q))
        ids[1:, 0, 0] = 0  # one group of some rows sees block 0: the other group stays zero
        got = sparse_attention(q, kc, vc, meta, ids, d ** -0.5)
        torch.testing.assert_close(got, _reference(q, kc, vc, meta, ids), rtol=1e-5, atol=2e-6)
        assert torch.equal(got[:, hq // hkv:], torch.zeros_like(got[:, hq // hkv:]))


def test_stale_nan_past_the_length_never_reaches_the_output():
    hq, hkv, d, B, k = 6, 3, 32, 16, 3
    meta, g = _batch([45, 1, 1], [45, 70, 17], B, seed=9)
    q, kc, vc, kic, q_idx = _tensors(meta, hq, hkv, d, B, g)
    ids = indexer_paged_reference(q_idx, kic, meta.page_table, meta.cu_seqlens_q, meta.seq_lens_kv, k)
    want = _reference(q, kc, vc, meta, ids)
    for pages, kl in zip(meta.page_lists, meta.kv_lens, strict=True):  # poison each last page's tail
        kc[pages[-1], :, kl % B or B:] = float("nan")
        vc[pages[-1], :, kl % B or B:] = float("nan")
    got = sparse_attention(q, kc, vc, meta, ids, d ** -0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def test_decode_steps_equal_the_decode_references():
    hq, hkv, d, B, k = 9, 3, 64, 64, 4
    meta, g = _batch([1] * 5, [1, 64, 65, 300, 1000], B, seed=13, n_pages=N_PAGES)
    q, kc, vc, kic, q_idx = _tensors(meta, hq, hkv, d, B, g)
    ids = decode_indexer_ref(q_idx, kic, meta.page_table, meta.seq_lens_kv, 1, k)
    want = sparse_decode_attention_ref(q, kc, vc, ids, meta.page_table, meta.seq_lens_kv, 1, d ** -0.5)[0]
    torch.testing.assert_close(sparse_attention(q, kc, vc, meta, ids, d ** -0.5), want, rtol=1e-5, atol=2e-6)


def test_msa_cpu_path_matches_msa_ref_greedy():
    """End to end on the real model with the shipped indexer at top-k 4 of 9 blocks (real, partial selections),
    prefilled in chunks (a chunk after a prefix), then decoded."""
    ids = LLM("smollm2-135m", attention="dense", device="cpu", progress=False, kv_cache_tokens=2048)._to_ids(
        "The lighthouse keeper climbed the stairs every evening to light the lamp. " * 80)[:1100]
    p = SamplingParams(max_tokens=8, ignore_eos=True)
    out = {}
    for kind in ("msa", "msa-ref"):
        llm = LLM("smollm2-135m", attention=kind, device="cpu", progress=False, kv_cache_tokens=2048,
                  max_num_batched_tokens=512, msa_overrides={"topk": 4})  # 4 of 9 blocks
        o = llm.generate([ids], p)[0]
        assert o.metrics["attention_density"] < 0.75
        out[kind] = o.token_ids
    assert out["msa"] == out["msa-ref"]
