"""Tile-design options (regrouping, TMA, step sizes, register cap, rare pass) against the reference, their
limits, and the auto design's tile-vs-token choice."""
import dataclasses

import pytest
import torch

from kernels._common.tiles import tile_table
from kernels.indexer import naive as indexer_naive
from kernels.sparse_prefill import msa_prefill_attention
from kernels.sparse_prefill.naive import sparse_attention_reference
from kernels.sparse_prefill.plan import TileConfig, prefer_tile, tile_flag
from kernels.sparse_prefill.unions import build_unions
from kernels.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _ids(case, topk):
    return indexer_naive.indexer_paged_reference(case["q_idx"], case["k_idx_cache"], case["page_table"],
                                                 case["cu_seqlens_q"], case["seq_lens_kv"], topk)


def _tile_call(case, cfg, k_cache=None):
    """The op with the tile design and ``cfg`` on the case (``k_cache`` in place of the case's)."""
    return msa_prefill_attention(case["q"], case["k_cache"] if k_cache is None else k_cache, case["v_cache"],
                                 case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"], _ids(case, 4),
                                 impl="triton", design="tile", tile_config=cfg)


def _poisoned(case):
    q = case["q"]
    return torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"), device=q.device)


def _reference(case, ids):
    return sparse_attention_reference(case["q"].float(), case["k_cache"].float(), case["v_cache"].float(),
                                      case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"], ids)


@pytest.mark.parametrize("cfg", [
    TileConfig(tile_q=8, rare_max=0),
    TileConfig(tile_q=4, rare_max=1, num_stages=1),
    TileConfig(tile_q=8, rare_max=2, block_n=32, maxnreg=128),  # 2-4 steps per block, causal per step
    TileConfig(tile_q=8, rare_max=1, group=True, block_n=64),
    TileConfig(tile_q=4, rare_max=2, group=True),
    TileConfig(tile_q=8, rare_max=3, group=True),
    TileConfig(tile_q=8, rare_max=1, tma=True, group=True, block_n=64),  # K / V through tensor descriptors
    TileConfig(tile_q=4, rare_max=2, tma=True, block_n=32),
    TileConfig(tile_q=8, rare_max=3, rare_block_n=32),  # rare pass in 32-key steps
])
@pytest.mark.parametrize("q_lens,kv_lens,hkv,group,d,block,topk", [
    ([24], [2500], 1, 16, 128, 64, 32),      # M3-like group, long history, prefix in the cache
    ([40, 3], [300, 130], 2, 4, 64, 128, 4),  # two requests, B = 128, T < B for one
])
def test_tile_options_match_reference(paged_case, cfg, q_lens, kv_lens, hkv, group, d, block, topk):
    case = paged_case(q_lens, kv_lens, hkv=hkv, group=group, d=d, block=block, dtype=torch.bfloat16, device=DEV,
                      seed=group + topk)
    ids = _ids(case, topk)
    out, lse = _poisoned(case)
    cfg = dataclasses.replace(cfg, kernel="triton")  # the Triton tile kernel's options (on sm_90 too)
    msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], case["page_table"], case["cu_seqlens_q"],
                          case["seq_lens_kv"], ids, impl="triton", design="tile", tile_config=cfg, out=out, lse=lse)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.parametrize("rare_max", [0, 2])
def test_grouped_tiles_match_reference(paged_case, rare_max):
    # several windows of 16 tiles, a partial last window, two requests with a prefix in the cache
    case = paged_case([300, 70], [1400, 70], hkv=2, group=4, d=64, block=64, dtype=torch.bfloat16, device=DEV,
                      seed=23)
    ids = _ids(case, 8)
    out, lse = _poisoned(case)
    cfg = TileConfig(tile_q=8, rare_max=rare_max, group=True)
    msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], case["page_table"], case["cu_seqlens_q"],
                          case["seq_lens_kv"], ids, impl="triton", design="tile", tile_config=cfg, out=out, lse=lse)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


def test_group_tiles_kernel_equals_reference_and_is_a_permutation():
    from kernels.sparse_prefill.grouping import group_tiles, group_tiles_reference
    gen = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 200, 203, 330], dtype=torch.int32)
    ids = torch.randint(0, 40, (330, 3, 8), dtype=torch.int32, generator=gen)
    ids[::5, :, 6:] = -1
    tiles = tile_table(cu.to(DEV), 330, 8, longest_first=False)
    got = group_tiles(ids.to(DEV), cu.to(DEV), *tiles, 8)
    assert torch.equal(got.cpu(), group_tiles_reference(ids, cu, 8).cpu())
    got4 = group_tiles(ids.to(DEV), cu.to(DEV), *tiles, 8, words=2)
    assert torch.equal(got4.cpu(), group_tiles_reference(ids, cu, 8, words=2).cpu())
    got32 = group_tiles(ids.to(DEV), cu.to(DEV), *tiles, 8, words=8, window=32)  # 256-token windows
    assert torch.equal(got32.cpu(), group_tiles_reference(ids, cu, 8, words=8, window=32).cpu())
    req = tiles[0].cpu()
    for g in range(3):  # every token once, in a tile of its own request's window
        toks = got[:, g][req >= 0].cpu()
        assert sorted(toks[toks >= 0].tolist()) == list(range(330))
        for tile in range(int((req >= 0).sum())):
            r = int(req[tile])
            members = toks[tile][toks[tile] >= 0]
            assert members.numel() and bool(((members >= cu[r]) & (members < cu[r + 1])).all())
    # a window of identical selections keeps neighbours together; two interleaved kinds get sorted
    two = torch.zeros((128, 1, 4), dtype=torch.int32)
    two[0::2, 0] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    two[1::2, 0] = torch.tensor([11, 12, 13, 14], dtype=torch.int32)
    tiles = tile_table(torch.tensor([0, 128], dtype=torch.int32, device=DEV), 128, 8, longest_first=False)
    got = group_tiles(two.to(DEV), torch.tensor([0, 128], dtype=torch.int32, device=DEV), *tiles, 8)
    for tile in range(16):
        assert len({int(x) % 2 for x in got[tile, 0].tolist()}) == 1  # one kind per tile


def test_rare_pass_must_be_known(paged_case):
    case = paged_case([10], [100], hkv=2, group=4, d=64, block=64, device=DEV)
    with pytest.raises(ValueError, match="rare_pass must be"):
        _tile_call(case, TileConfig(rare_pass="pairs"))


def test_items_rare_pass_needs_the_gluon_kernel(paged_case):
    case = paged_case([10], [100], hkv=2, group=4, d=64, block=64, device=DEV)
    with pytest.raises(ValueError, match="rare_pass='items' runs in the Gluon tile kernel"):
        _tile_call(case, TileConfig(kernel="triton", rare_max=1, rare_pass="items"))


def test_tma_needs_contiguous_caches(paged_case):
    case = paged_case([10], [100], hkv=2, group=4, d=64, block=64, device=DEV)
    k = case["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, heads not outermost
    with pytest.raises(ValueError, match="tma=True needs contiguous k_cache"):
        _tile_call(case, TileConfig(tma=True), k_cache=k)


@pytest.mark.parametrize("field", ["block_n", "rare_block_n"])
def test_block_n_must_divide_the_block(paged_case, field):
    case = paged_case([10], [100], hkv=2, group=4, d=64, block=64, device=DEV)
    with pytest.raises(ValueError, match=f"{field} must divide"):
        _tile_call(case, TileConfig(**{field: 48}))


def test_device_flag_follows_prefer_tile():
    count = torch.tensor([[20, 30], [25, 25], [0, 0]], dtype=torch.int32)
    tile_req = torch.tensor([0, 0, -1], dtype=torch.int32)  # the last tile is surplus: not averaged
    rare = torch.tensor([[[3, -1], [4, 5]]], dtype=torch.int32)  # 3 rare pairs: 3 / tile_q union blocks
    for topk, tile_q, group in [(16, 8, 16), (4, 8, 16), (16, 16, 3), (4, 4, 2)]:
        mean = (100 + 3 / tile_q) / 4
        want = prefer_tile(mean, topk, tile_q, group)
        assert tile_flag(count, rare, tile_req, topk, tile_q, group).tolist() == [int(want)]
    assert tile_flag(count, None, tile_req, 4, 8, 16).tolist() == [int(prefer_tile(25.0, 4, 8, 16))]


def test_auto_design_picks_per_token_for_scattered_selections(paged_case):
    # random index inputs at k = 4 over ~40 blocks: 8 neighbours share almost nothing, the union
    # (~20 blocks for 32 selections, no rare split) is past the break-even (12), so auto must give
    # the per-token result
    case = paged_case([16], [5000], hkv=1, group=16, d=64, block=128, dtype=torch.bfloat16, device=DEV, seed=11)
    ids = _ids(case, 4)
    args = (case["q"], case["k_cache"], case["v_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    tiles = tile_table(case["cu_seqlens_q"], 16, 8, longest_first=False)
    union = build_unions(ids, case["page_table"], case["cu_seqlens_q"], *tiles, 8)
    assert tile_flag(union.count, union.rare_ids, tiles[0], 4, 8, 16).item() == 0
    token = msa_prefill_attention(*args, ids, impl="triton", design="token")
    got = msa_prefill_attention(*args, ids, impl="triton", design="auto", rare_max=0)
    assert torch.equal(got[0], token[0]) and torch.equal(got[1], token[1])  # the same kernel ran


def test_auto_design_picks_the_tile_for_shared_selections(paged_case):
    case = paged_case([45, 7], [300, 7], hkv=2, group=8, d=64, block=64, dtype=torch.bfloat16, device=DEV, seed=3)
    ids = _ids(case, 8)
    args = (case["q"], case["k_cache"], case["v_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    got = msa_prefill_attention(*args, ids, impl="triton", design="auto")
    tile = msa_prefill_attention(*args, ids, impl="triton", design="tile")
    assert torch.equal(got[0], tile[0]) and torch.equal(got[1], tile[1])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("cfg", [
    TileConfig(tile_q=8, rare_max=2), TileConfig(tile_q=8, rare_max=2, num_warps=4, num_stages=2),
    TileConfig(tile_q=4, rare_max=1, num_warps=4, num_stages=1),
    TileConfig(tile_q=8, rare_max=2, block_n=64, maxnreg=128, num_stages=2),
    TileConfig(tile_q=8, rare_max=2, block_n=64, maxnreg=128, num_stages=3),
    TileConfig(group=True, rare_max=2), TileConfig(group=False), TileConfig(tma=True),
    TileConfig(tma=True, group=False, block_n=0, maxnreg=0), TileConfig(rare_max=2, rare_block_n=0),
    TileConfig(kernel="gluon", rare_max=2), None])
def test_tile_options_gpu_m3(paged_case, cfg):
    case = paged_case([1500, 700], [6000, 700], hkv=4, group=16, d=128, block=128, d_idx=128, device="cuda", seed=21)
    from kernels.indexer import msa_indexer
    ids = msa_indexer(case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"],
                      case["seq_lens_kv"], 16)
    out, lse = _poisoned(case)
    if cfg is not None and cfg.kernel is None:  # the Triton tile kernel's options; None: the op's defaults
        cfg = dataclasses.replace(cfg, kernel="triton")
    msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], case["page_table"], case["cu_seqlens_q"],
                          case["seq_lens_kv"], ids, design="tile" if cfg else "auto", tile_config=cfg, out=out, lse=lse)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_engine_path_has_no_host_sync(paged_case):
    # what engine/attention/msa.py calls per MSA layer (design "tile"): indexer and attention with the
    # host checks off; any synchronising CUDA call raises in sync-debug "error" mode
    case = paged_case([900, 300], [3000, 300], hkv=4, group=16, d=128, block=128, d_idx=128, device="cuda", seed=4)
    from kernels.indexer import msa_indexer
    args = (case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], *args,
                          msa_indexer(case["q_idx"], case["k_idx_cache"], *args, 16))  # compile outside
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids = msa_indexer(case["q_idx"], case["k_idx_cache"], *args, 16, check_lengths=False)
        out, lse = msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], *args, ids, design="tile",
                                         check_ids=False, check_lengths=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert lse.dtype == torch.float32
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)
