"""The sparse prefill plan: which kernel and rare pass run on which device and inputs, with which sizes, and
every limit as a ValueError with its own message (devices described, so it all runs on the CPU)."""
import dataclasses

import pytest
import torch

from kernels._common.device import DeviceInfo, device_info
from kernels.sparse_prefill.plan import PrefillShape, TileConfig, plan_prefill

H200 = DeviceInfo(sm_major=9, sms=132, gluon=True)
H100_OLD_TRITON = DeviceInfo(sm_major=9, sms=132, gluon=False)  # Hopper, a Triton without Gluon
A100 = DeviceInfo(sm_major=8, sms=108)
CPU = DeviceInfo(interpret=True)
M3 = PrefillShape(tokens=131072, requests=1, pages=1024, q_heads=64, kv_heads=4, head_dim=128, block=128, topk=16)
SMOLLM2 = PrefillShape(tokens=32768, requests=1, pages=512, q_heads=9, kv_heads=3, head_dim=64, block=64, topk=16)


def _plan(shape=M3, device=H200, **cfg):
    return plan_prefill(shape, device, design=cfg.pop("design", "tile"), config=TileConfig(**cfg))


def test_m3_on_sm90_runs_the_gluon_kernel_with_the_items_pass():
    p = _plan()
    assert (p.kernel, p.rare_pass, p.rare_max, p.tile_q, p.block_m) == ("gluon", "items", 2, 8, 128)
    assert p.group and p.q_tma and (p.block_n, p.num_stages) == (128, 2)
    assert p.programs == 132 and p.rare_programs == 132  # one persistent program per SM


@pytest.mark.parametrize("device,tma,maxnreg", [(A100, False, 0), (H100_OLD_TRITON, True, 128), (CPU, False, 0)])
def test_m3_elsewhere_runs_the_triton_kernel_with_the_token_pass(device, tma, maxnreg):
    p = _plan(device=device)
    assert (p.kernel, p.rare_pass, p.rare_max) == ("triton", "token", 1)
    assert (p.block_n, p.num_warps, p.num_stages, p.rare_warps, p.rare_block_n) == (64, 8, 3, 2, 64)
    assert (p.tma, p.maxnreg) == (tma, maxnreg)  # TMA and the register cap on Hopper only
    assert p.group


def test_non_contiguous_caches_take_the_triton_kernel_and_non_contiguous_q_the_token_pass():
    p = _plan(dataclasses.replace(M3, kv_contiguous=False))
    assert (p.kernel, p.rare_pass, p.tma) == ("triton", "token", False)
    p = _plan(dataclasses.replace(M3, q_contiguous=False))
    assert (p.kernel, p.rare_pass, p.q_tma) == ("gluon", "token", False)  # Q and out by the consumers


def test_gluon_needs_exactly_128_rows():
    # 12 heads per group at 8-token tiles: 96 rows (128 once padded), the Triton kernel's
    shape = dataclasses.replace(M3, q_heads=48)
    assert _plan(shape).kernel == "triton"
    eight = dataclasses.replace(M3, q_heads=32)  # G = 8: 64 rows at the default 8-token tiles
    assert _plan(eight).kernel == "triton"
    assert (_plan(eight, tile_q=16).kernel, _plan(eight, tile_q=16).rare_pass) == ("gluon", "items")


def test_small_groups_and_the_other_designs():
    p = _plan(SMOLLM2)
    assert (p.kernel, p.tile_q, p.block_m, p.rare_max, p.rare_pass, p.group) == ("triton", 16, 64, 0, None, False)
    assert (p.block_n, p.num_warps, p.num_stages) == (0, 4, 2)
    assert _plan(design="token").kernel == "token"
    assert _plan(design="auto").auto and not _plan().auto
    assert plan_prefill(M3, H200, impl="torch").kernel == "torch"


def test_overrides_win():
    p = _plan(kernel="triton", rare_max=3, group=False, block_n=32, num_warps=4, num_stages=2, maxnreg=0, tma=False)
    assert (p.kernel, p.rare_pass, p.rare_max, p.group) == ("triton", "token", 3, False)
    assert (p.block_n, p.num_warps, p.num_stages, p.maxnreg, p.tma) == (32, 4, 2, 0, False)
    p = _plan(rare_pass="token", block_n=64, num_stages=3)
    assert (p.kernel, p.rare_pass, p.rare_max, p.q_tma) == ("gluon", "token", 1, True)
    assert _plan(rare_max=0).rare_pass is None


def test_the_cpu_plan_is_the_interpreters():
    info = device_info(torch.device("cpu"))
    assert info.sm_major == 0 and not info.gluon
    assert plan_prefill(M3, info).kernel == "triton"


@pytest.mark.parametrize("shape,device,cfg,match", [
    (M3, A100, dict(kernel="gluon"), r"kernel='gluon' needs a Hopper GPU \(sm_90\)"),
    (M3, H100_OLD_TRITON, dict(kernel="gluon"), r"kernel='gluon' needs a Hopper GPU \(sm_90\)"),
    (M3, H200, dict(kernel="gluon", tile_q=4), r"kernel='gluon' needs 128-row tiles .* got 64 rows"),
    (dataclasses.replace(M3, kv_contiguous=False), H200, dict(kernel="gluon"),
     r"kernel='gluon' needs contiguous k_cache and v_cache"),
    (M3, H200, dict(num_stages=4), "kernel='gluon' with 4 stages of 128 keys needs .* use fewer stages"),
    (dataclasses.replace(M3, q_heads=16), H200, dict(kernel="gluon", tile_q=32, rare_max=8, rare_pass="items"),
     "rare_pass='items' needs contiguous q and out, a group of 8 or 16"),
    (dataclasses.replace(M3, q_contiguous=False), H200, dict(rare_pass="items"),
     "rare_pass='items' needs contiguous q and out"),
    (M3, A100, dict(rare_pass="items"), r"rare_pass='items' runs in the Gluon tile kernel"),
    (M3, H200, dict(kernel="triton", rare_pass="items"), r"rare_pass='items' runs in the Gluon tile kernel"),
    (M3, A100, dict(tma=True), r"tma=True needs a Hopper or newer GPU"),
    (dataclasses.replace(M3, kv_contiguous=False), H100_OLD_TRITON, dict(tma=True),
     r"tma=True needs contiguous k_cache and v_cache"),
    (M3, H200, dict(kernel="cuda"), "kernel must be 'triton' or 'gluon'"),
    (M3, H200, dict(rare_pass="tail"), "rare_pass must be 'token' or 'items'"),
    (M3, H200, dict(tile_q=12), "tile_q must be one of"),
    (M3, H200, dict(tile_q=8, rare_max=8), r"rare_max must be in 0\.\.tile_q-1 = 0\.\.7"),
    (M3, A100, dict(block_n=48), "block_n must divide the block size 128"),
    (M3, A100, dict(rare_block_n=8), "rare_block_n must divide the block size 128 and be >= 16"),
    (M3, H200, dict(design="auto_device"), "design must be 'auto', 'tile' or 'token'"),
])
def test_each_limit_is_a_value_error_with_its_own_message(shape, device, cfg, match):
    with pytest.raises(ValueError, match=match):
        _plan(shape, device, **cfg)


def test_tma_under_the_interpreter_is_allowed():
    assert _plan(device=CPU, tma=True).tma
