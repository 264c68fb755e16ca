"""Sparse prefill attention: reference vs SDPA, Triton kernels vs reference, bad input."""
import pytest
import torch

from kernels._common.tiles import tile_table
from kernels.indexer import naive as indexer_naive
from kernels.sparse_prefill import msa_prefill_attention
from kernels.sparse_prefill.naive import dense_causal_reference, sparse_attention_reference
from kernels.sparse_prefill.plan import TileConfig, prefer_tile
from kernels.sparse_prefill.unions import build_unions, tile_unions
from kernels.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _ids(case, topk):
    return indexer_naive.indexer_paged_reference(case["q_idx"], case["k_idx_cache"], case["page_table"],
                                                 case["cu_seqlens_q"], case["seq_lens_kv"], topk)


def _run(case, ids, **kw):
    if kw.get("impl") != "torch":  # NaN-poisoned outputs: every element must be written
        kw.setdefault("out", torch.full_like(case["q"], float("nan")))
        kw.setdefault("lse", torch.full(case["q"].shape[:2], float("nan"), device=case["q"].device))
    return msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], case["page_table"],
                                 case["cu_seqlens_q"], case["seq_lens_kv"], ids, **kw)


def _reference(case, ids):
    return sparse_attention_reference(case["q"].float(), case["k_cache"].float(), case["v_cache"].float(),
                                      case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"], ids)


def test_reference_equals_sdpa_when_every_block_is_selected(paged_case):
    case = paged_case([30, 64, 1], [200, 64, 129], hkv=2, group=3, d=64, block=64, dtype=torch.float32)
    out, lse = _run(case, _ids(case, 4), impl="torch")
    dense = dense_causal_reference(case["q"], case["k_cache"], case["v_cache"], case["page_table"],
                                   case["cu_seqlens_q"], case["seq_lens_kv"])
    assert out.dtype == dense.dtype
    assert_close("out", dense, out, 1e-5, atol=1e-5)
    assert torch.isfinite(lse).all()


CASES = [  # q_lens, kv_lens, Hkv, G, d, B, topk, dtype
    ([45, 7, 33], [300, 7, 200], 2, 3, 64, 64, 4, torch.bfloat16),
    ([20], [20], 1, 16, 128, 64, 8, torch.float16),  # T < B, no prefix
    ([70, 9], [1000, 600], 1, 1, 64, 64, 16, torch.bfloat16),
    ([24], [2500], 1, 16, 128, 64, 32, torch.bfloat16),
    ([40, 3], [300, 130], 2, 4, 64, 128, 4, torch.float16),
]


@pytest.mark.parametrize("design", ["tile", "token"])
@pytest.mark.parametrize("q_lens,kv_lens,hkv,group,d,block,topk,dtype", CASES)
def test_kernel_matches_reference(paged_case, design, q_lens, kv_lens, hkv, group, d, block, topk, dtype):
    if design == "token" and sum(q_lens) * hkv > 80:  # the interpreter runs one program per token
        q_lens = [min(n, 20) for n in q_lens]
    case = paged_case(q_lens, kv_lens, hkv=hkv, group=group, d=d, block=block, dtype=dtype, device=DEV,
                      seed=topk + group)
    ids = _ids(case, topk)
    out, lse = _run(case, ids, impl="triton", design=design)
    assert out.dtype == dtype and lse.dtype == torch.float32
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out, atol=6e-2)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.parametrize("design", ["tile", "token", "auto"])
def test_kernel_equals_sdpa_when_every_block_is_selected(paged_case, design):
    case = paged_case([21, 5], [300, 64], hkv=2, group=2, d=64, block=64, dtype=torch.float16, device=DEV)
    out, lse = _run(case, _ids(case, 8), impl="triton", design=design)
    dense = dense_causal_reference(case["q"], case["k_cache"], case["v_cache"], case["page_table"],
                                   case["cu_seqlens_q"], case["seq_lens_kv"])
    assert_close("out", dense, out, 5e-3)


@pytest.mark.parametrize("design", ["tile", "token"])
def test_empty_selection_gives_zero_and_minus_inf(paged_case, design):
    case = paged_case([6], [200], hkv=2, group=3, d=64, block=64, device=DEV)
    ids = _ids(case, 4)
    ids[2] = -1  # token 2 selects nothing in either head
    ids[4, 1] = -1
    out, lse = _run(case, ids, impl="triton", design=design)
    assert (out[2] == 0).all() and torch.isneginf(lse[2]).all()
    assert (out[4, 3:] == 0).all() and torch.isneginf(lse[4, 3:]).all()
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out, atol=6e-2)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


def test_union_kernel_matches_torch_unions(paged_case):
    case = paged_case([45, 7, 33], [300, 7, 200], hkv=2, group=3, d=64, block=64, device=DEV)
    ids = _ids(case, 8)
    ids[50, 1] = -1  # a token with an empty selection in one head
    tiles = tile_table(case["cu_seqlens_q"], 85, 8, longest_first=False)
    union, pages, count = build_unions(ids, case["page_table"], case["cu_seqlens_q"], *tiles, 8)
    ref, ref_count = tile_unions(ids, *tiles, case["cu_seqlens_q"], 8)
    assert torch.equal(count, ref_count)
    big = torch.iinfo(torch.int32).max
    assert torch.equal(torch.where(union < 0, big, union).sort(-1).values,
                       torch.where(ref < 0, big, ref).sort(-1).values)
    valid = union >= 0
    assert (valid.sum(-1) == count).all() and (union[~valid] == -1).all()
    req = tiles[0].long().clamp(min=0)[:, None, None].expand_as(union)
    assert torch.equal(pages[valid], case["page_table"][req[valid], union[valid].long()])


@pytest.mark.parametrize("tile_q,rare_max", [(8, 1), (8, 2), (16, 3)])
def test_union_token_masks_and_rare_split(paged_case, tile_q, rare_max):
    case = paged_case([45, 7, 33], [300, 7, 200], hkv=2, group=3, d=64, block=64, device=DEV)
    ids = _ids(case, 8)
    ids[50, 1] = -1
    tiles = tile_table(case["cu_seqlens_q"], 85, tile_q, longest_first=False)
    full = build_unions(ids, case["page_table"], case["cu_seqlens_q"], *tiles, tile_q)
    split = build_unions(ids, case["page_table"], case["cu_seqlens_q"], *tiles, tile_q, rare_max=rare_max)
    assert full.rare_ids is None
    ids_c, tile_req, tile_start = ids.cpu(), tiles[0].cpu(), tiles[1].cpu()
    cu = case["cu_seqlens_q"].cpu()
    n_rare_pairs = 0
    for tile in range(tile_req.shape[0]):
        if tile_req[tile] < 0:
            assert (full.count[tile] == 0).all()
            continue
        toks = [t for t in range(tile_start[tile], tile_start[tile] + tile_q) if t < cu[tile_req[tile] + 1]]
        for g in range(2):
            sel = {t: set(ids_c[t, g].tolist()) - {-1} for t in toks}
            want = {}
            for j, t in enumerate(toks):
                for b in sel[t]:
                    want[b] = want.get(b, 0) | (1 << j)
            n = int(full.count[tile, g])
            got = dict(zip(full.union[tile, g, :n].tolist(), full.token_mask[tile, g, :n].tolist(), strict=True))
            assert got == want
            common = {b: m for b, m in want.items() if bin(m).count("1") > rare_max}
            n = int(split.count[tile, g])
            got = dict(zip(split.union[tile, g, :n].tolist(), split.token_mask[tile, g, :n].tolist(), strict=True))
            assert got == common
            assert (split.union[tile, g, n:] == -1).all()
            for t in toks:
                rare = split.rare_ids[t, g].tolist()
                k = len([b for b in rare if b >= 0])
                assert rare[k:] == [-1] * (8 - k) and set(rare[:k]) == sel[t] - set(common)
                n_rare_pairs += k
    assert n_rare_pairs > 0  # the case exercises the split


@pytest.mark.parametrize("rare_max", [1, 2])
@pytest.mark.parametrize("q_lens,kv_lens,hkv,group,d,block,topk,dtype", [CASES[0], CASES[3], CASES[4]])
def test_rare_split_matches_reference(paged_case, rare_max, q_lens, kv_lens, hkv, group, d, block, topk, dtype):
    case = paged_case(q_lens, kv_lens, hkv=hkv, group=group, d=d, block=block, dtype=dtype, device=DEV,
                      seed=topk + group + rare_max)
    ids = _ids(case, topk)
    out, lse = _run(case, ids, impl="triton", design="tile", tile_q=8, rare_max=rare_max)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out, atol=6e-2)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


def test_auto_design_follows_the_measured_break_even():
    # H200 measurements (benchmarks/kernels/RESULTS.md): M3 shape, structured selections (union 25
    # blocks per tile of 8 tokens) ran faster tiled, random ones (union 88) faster per token;
    # SmolLM2 (G = 3, union 41 per 16 tokens) ran 2.6x faster tiled.
    assert prefer_tile(25.0, 16, 8, 16)
    assert not prefer_tile(88.4, 16, 8, 16)
    assert prefer_tile(41.2, 16, 16, 3)


def _case_for_errors(paged_case):
    case = paged_case([10, 20], [100, 200], hkv=2, group=3, d=64, block=64)
    return case, _ids(case, 4)


@pytest.mark.parametrize("edit,match", [
    (lambda c, ids: c.update(q=c["q"].float()), "k_cache must be one of"),
    (lambda c, ids: c.update(q=c["q"].to(torch.int8)), "q must be one of"),
    (lambda c, ids: c.update(k_cache=c["k_cache"][:, :1]), "v_cache must have k_cache's shape"),
    (lambda c, ids: c.update(v_cache=c["v_cache"].transpose(2, 3).contiguous().transpose(2, 3)), "unit stride"),
    (lambda c, ids: c.update(v_cache=c["v_cache"].to("meta")), "is on meta"),
    (lambda c, ids: c.update(q=torch.zeros(30, 6, 96, dtype=torch.bfloat16)), "head dim"),
    (lambda c, ids: c.update(q=torch.zeros(30, 34, 64, dtype=torch.bfloat16)), "multiple 1..16"),
    (lambda c, ids: ids.__setitem__((3, 0, 0), 99), "out-of-range"),
    (lambda c, ids: ids.__setitem__((25, 1, 0), ids[25, 1, 1].item()), "must not repeat"),
    (lambda c, ids: ids.__setitem__((25, 1, 0), -1), "valid prefix"),
    (lambda c, ids: c.update(out=torch.zeros(30, 6, 64)), "out must be a contiguous"),
])
def test_rejects_bad_input(paged_case, edit, match):
    case, ids = _case_for_errors(paged_case)
    edit(case, ids)
    with pytest.raises(ValueError, match=match):
        _run(case, ids, impl="torch", **({"out": case.pop("out")} if "out" in case else {}))


def test_rejects_bad_tile_options(paged_case):
    case = paged_case([10, 20], [100, 200], hkv=2, group=3, d=64, block=64, device=DEV)
    ids = _ids(case, 4)
    with pytest.raises(ValueError, match="tile_q must be one of"):
        _run(case, ids, impl="triton", design="tile", tile_q=12)
    with pytest.raises(ValueError, match=r"rare_max must be in 0\.\.tile_q-1 = 0\.\.7"):
        _run(case, ids, impl="triton", design="tile", tile_q=8, rare_max=8)


def test_rejects_wrong_ids_shape_and_topk(paged_case):
    case, ids = _case_for_errors(paged_case)
    with pytest.raises(ValueError, match="dim 1"):
        _run(case, ids[:, :1].contiguous(), impl="torch")
    with pytest.raises(ValueError, match="topk"):
        _run(case, torch.cat([ids, ids[..., :1]], -1), impl="torch")
    with pytest.raises(ValueError, match="topk_ids must be one of"):
        _run(case, ids.long(), impl="torch")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("num_stages", [2, 3])
def test_tile_kernel_gpu_pipelining_depths(paged_case, num_stages):
    case = paged_case([1500, 700], [6000, 700], hkv=4, group=16, d=128, block=128, d_idx=128, device="cuda", seed=5)
    ids = _ids(case, 16)
    out, lse = _run(case, ids, design="tile", tile_config=TileConfig(tile_q=8, rare_max=0, num_stages=num_stages))
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out, atol=6e-2)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("rare_max", [0, 2])
def test_rare_split_gpu_m3(paged_case, rare_max):
    case = paged_case([1500, 700], [6000, 700], hkv=4, group=16, d=128, block=128, d_idx=128, device="cuda", seed=9)
    from kernels.indexer import msa_indexer
    ids = msa_indexer(case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"],
                      case["seq_lens_kv"], 16)
    out, lse = _run(case, ids, design="tile", tile_q=8, rare_max=rare_max)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out, atol=6e-2)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("design", ["tile", "token"])
@pytest.mark.parametrize("hkv,group,d,block,topk", [(4, 16, 128, 128, 16), (3, 3, 64, 64, 32), (2, 8, 64, 128, 4)])
def test_kernel_gpu_large(paged_case, design, hkv, group, d, block, topk):
    case = paged_case([1500, 1, 2500], [6000, 4000, 2500], hkv=hkv, group=group, d=d, block=block,
                      d_idx=128, device="cuda", seed=group)
    from kernels.indexer import msa_indexer
    ids = msa_indexer(case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"],
                      case["seq_lens_kv"], topk)
    out, lse = _run(case, ids, design=design)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out, atol=6e-2)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)
