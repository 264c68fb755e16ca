"""The warp-specialised Gluon tile kernel (Hopper only) against the fp32 reference, and its limits."""
import dataclasses

import pytest
import torch

from kernels.sparse_prefill import msa_prefill_attention
from kernels.sparse_prefill.naive import sparse_attention_reference
from kernels.sparse_prefill.plan import TileConfig
from kernels.testing import assert_close

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] == 9
DEV = "cuda" if CUDA else "cpu"


def _run(case, ids, cfg):
    out = torch.full_like(case["q"], float("nan"))
    lse = torch.full(case["q"].shape[:2], float("nan"), device=case["q"].device)
    msa_prefill_attention(case["q"], case["k_cache"], case["v_cache"], case["page_table"], case["cu_seqlens_q"],
                          case["seq_lens_kv"], ids, impl="triton", design="tile", tile_config=cfg, out=out, lse=lse)
    return out, lse


def _reference(case, ids):
    return sparse_attention_reference(case["q"].float(), case["k_cache"].float(), case["v_cache"].float(),
                                      case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"], ids)


def _indexer_ids(case, topk):
    from kernels.indexer import msa_indexer
    return msa_indexer(case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"],
                       case["seq_lens_kv"], topk)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("cfg", [
    TileConfig(kernel="gluon"),  # whole-block steps, 2 stages, Q by TMA, items pass
    TileConfig(kernel="gluon", group=False),  # tiles of consecutive tokens: out by TMA skips slots past a request
    TileConfig(kernel="gluon", rare_pass="token"),  # rare pairs per token
    TileConfig(kernel="gluon", rare_pass="items", rare_max=3, group=False),  # more rounds, consecutive tiles
    TileConfig(kernel="gluon", block_n=64, num_stages=3),  # (the items pass keeps whole blocks, 2 stages)
    TileConfig(kernel="gluon", block_n=128, num_stages=3),  # no room for two Q buffers: Q by the consumers
    TileConfig(kernel="gluon", block_n=128, num_stages=3, group=False, rare_max=0),
    TileConfig(kernel="gluon", block_n=32, num_stages=2, rare_max=3),
    TileConfig(kernel="gluon", block_n=64, num_stages=3, rare_pass="token", rare_max=2),
])
@pytest.mark.parametrize("q_lens,kv_lens,hkv,group,d,block,topk,tile_q", [
    ([1500, 700], [6000, 700], 4, 16, 128, 128, 16, 8),  # M3 shape, prefix in the cache, two requests
    ([37, 300], [2100, 300], 2, 8, 64, 64, 8, 16),        # d 64, B 64, 16-token tiles, T < tile for one
    ([90], [90], 1, 4, 128, 128, 4, 32),                 # T < B: only the own block, 32-token tiles
])
def test_gluon_tile_matches_reference(paged_case, cfg, q_lens, kv_lens, hkv, group, d, block, topk, tile_q):
    if cfg.block_n and block % cfg.block_n:
        pytest.skip("block_n must divide the block")
    if cfg.rare_pass == "items" and group not in (8, 16):
        pytest.skip("the items pass needs Q by TMA (groups of 8 or 16 heads): see the launch-limit test")
    case = paged_case(q_lens, kv_lens, hkv=hkv, group=group, d=d, block=block, d_idx=d, dtype=torch.bfloat16,
                      device="cuda", seed=group + topk)
    ids = _indexer_ids(case, topk)
    cfg = dataclasses.replace(cfg, tile_q=tile_q)
    out, lse = _run(case, ids, cfg)
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
def test_gluon_tile_equals_triton_tile_kernel(paged_case):
    # the same unions through both tile kernels: the same math, so bf16-rounding close
    case = paged_case([2000], [9000], hkv=4, group=16, d=128, block=128, d_idx=128, device="cuda", seed=5)
    ids = _indexer_ids(case, 16)
    # (the same rare split and pass: the Gluon default's items pass at rare_max 2 rounds its merges
    # differently; it is checked against the reference above)
    out_t, lse_t = _run(case, ids, TileConfig(kernel="triton", rare_max=1, rare_pass="token"))
    out_g, lse_g = _run(case, ids, TileConfig(kernel="gluon", rare_max=1, rare_pass="token"))
    assert_close("out", out_t, out_g, 4e-3)
    assert_close("lse", lse_t, lse_g, 1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("q_lens,kv_lens,group,seed,cfg,match", [
    ([300], [300], 16, 2, TileConfig(kernel="gluon", block_n=128, num_stages=4), "fewer stages or a smaller block_n"),
    # the items pass needs Q by TMA: not for a group of 4 heads
    ([90], [400], 4, 3, TileConfig(kernel="gluon", tile_q=32, rare_max=8, rare_pass="items"),
     "rare_pass='items' needs contiguous q and out, a group of 8 or 16"),
])
def test_gluon_launch_limits_are_value_errors(paged_case, q_lens, kv_lens, group, seed, cfg, match):
    case = paged_case(q_lens, kv_lens, hkv=1, group=group, d=128, block=128, d_idx=128, device="cuda", seed=seed)
    ids = _indexer_ids(case, 4)
    with pytest.raises(ValueError, match=match):
        _run(case, ids, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
def test_gluon_tile_needs_contiguous_caches_and_the_default_falls_back(paged_case):
    case = paged_case([200], [900], hkv=2, group=16, d=128, block=128, d_idx=128, device="cuda", seed=4)
    ids = _indexer_ids(case, 8)
    k = case["k_cache"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, heads not outermost
    strided = dict(case, k_cache=k)
    with pytest.raises(ValueError, match="kernel='gluon' needs contiguous k_cache"):
        _run(strided, ids, TileConfig(kernel="gluon"))
    out, lse = _run(strided, ids, TileConfig())  # the default takes the Triton kernel there
    ref_out, ref_lse = _run(case, ids, TileConfig(kernel="gluon"))
    assert_close("out", ref_out, out, 4e-3)
    assert_close("lse", ref_lse, lse, 1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gluon_tile_fp16_and_bf16(paged_case, dtype):
    case = paged_case([700, 130], [3000, 130], hkv=2, group=8, d=128, block=64, d_idx=128, dtype=dtype,
                      device="cuda", seed=9)
    ids = _indexer_ids(case, 16)
    out, lse = _run(case, ids, TileConfig(kernel="gluon", tile_q=16))
    assert out.dtype == dtype
    ref_out, ref_lse = _reference(case, ids)
    assert_close("out", ref_out, out)
    assert_close("lse", ref_lse, lse, 1e-3, atol=1e-3)


@pytest.mark.parametrize("cfg,match", [
    (TileConfig(kernel="cuda"), "kernel must be 'triton' or 'gluon'"),
    (TileConfig(kernel="gluon"), "kernel='gluon' needs a Hopper GPU" if not HOPPER else "needs 128-row tiles"),
])
def test_gluon_tile_limits_are_value_errors(paged_case, cfg, match):
    # (each Gluon limit against its own message, for a described device: test_sparse_prefill_plan.py)
    case = paged_case([20], [300], hkv=1, group=8, d=64, block=64, device=DEV)
    from kernels.indexer import naive as indexer_naive
    ids = indexer_naive.indexer_paged_reference(case["q_idx"], case["k_idx_cache"], case["page_table"],
                                                case["cu_seqlens_q"], case["seq_lens_kv"], 4)
    with pytest.raises(ValueError, match=match):
        _run(case, ids, cfg)
