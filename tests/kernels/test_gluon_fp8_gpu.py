"""Q8KV8 in the Gluon tile and rare kernels (``kernels/sparse_prefill/gluon_tile_fp8.py``, Hopper only)
against the exact dequantising torch attention, written here (no dependency on the op's wiring): the
M3 shape at 8K and a 32K chunk after a prefix, d 64, Q by TMA or by the consumers, whole blocks and
sub-block steps, the tile pass alone and tile + rare items pass; and the one-line input errors (CPU).

The tolerances are what the kernel's own rounding costs, measured by ``emulate_q8kv8`` on the CPU
(``test_emulated_rounding_...``). e4m3 Q per row moves these random (flat-softmax) outputs by about 5 %
relative RMS and the LSE by up to 0.3 against the exact reference, so the kernel is held to the
reference with Q rounded by the same rule (``model_q``): its LSE (from the fp32 scores and sums, no P
rounding) within 0.01, its out within twice the e4m3 P rounding's 3 %; and to the exact one within
twice the whole emulated 6 %.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from kernels._common.fp8 import FP8, dequantize_rows, quantize_rows

CUDA = torch.cuda.is_available()
HOPPER = CUDA and torch.cuda.get_device_capability()[0] == 9
OUT_RMS = 0.06  # relative RMS error of out against the reference with Q rounded (model_q)
LSE_ABS = 0.01  # max |lse - ref| (natural log), the same reference
EXACT_RMS = 0.15  # relative RMS error of out against the exact dequantised reference


def fp8_case(q_lens, kv_lens, hkv, group, d, block, topk, seed=0, device="cuda"):
    """A packed batch over a scattered paged e4m3 cache: q bf16 ``[T, Hq, d]``, caches ``[P, Hkv, B, d]``
    with fp32 scales ``[P, Hkv, B]`` (every slot written, so no garbage scale), page table, lengths and
    valid top-k ids (the indexer's format: ranked earlier blocks, the own block next, then -1)."""
    from kernels.testing import make_page_table

    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // block) for n in kv_lens]
    max_pages = max(need) + 1
    num_pages = 2 * len(q_lens) * max_pages + 3
    page_table = make_page_table(len(q_lens), max_pages, num_pages, gen).to(device)
    dgen = torch.Generator(device=device).manual_seed(seed)
    t = sum(q_lens)
    q = torch.randn(t, hkv * group, d, generator=dgen, device=device).to(torch.bfloat16)
    # per-token magnitudes that differ (the scales matter) and a shared direction (peaked softmax rows)
    kmag = torch.rand(num_pages, hkv, block, 1, generator=dgen, device=device) * 3 + 0.25
    k8, k_scale = quantize_rows(torch.randn(num_pages, hkv, block, d, generator=dgen, device=device) * kmag)
    vmag = torch.rand(num_pages, hkv, block, 1, generator=dgen, device=device) * 3 + 0.25
    v8, v_scale = quantize_rows(torch.randn(num_pages, hkv, block, d, generator=dgen, device=device) * vmag)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    ids = _topk_ids(q_lens, kv_lens, hkv, block, topk, dgen, device)
    return dict(q=q, k_cache=k8, v_cache=v8, k_scale=k_scale, v_scale=v_scale, page_table=page_table,
                cu_seqlens_q=cu.to(device), seq_lens_kv=torch.tensor(kv_lens, dtype=torch.int32, device=device),
                topk_ids=ids)


def _topk_ids(q_lens, kv_lens, hkv, block, topk, gen, device):
    """Each token's ``min(topk, own + 1)`` blocks: ``topk - 1`` earlier ones ranked by a score that
    tokens of one 8-token group mostly share (unions the tiles can share, some rare pairs), then its
    own block, then -1."""
    out = []
    for q_len, kv_len in zip(q_lens, kv_lens, strict=True):
        nb = -(-kv_len // block)
        pos = torch.arange(kv_len - q_len, kv_len, device=device)
        own = pos // block
        shared = torch.rand(q_len // 8 + 1, hkv, nb, generator=gen, device=device)
        score = shared[torch.arange(q_len, device=device) // 8] + 0.3 * torch.rand(q_len, hkv, nb, generator=gen,
                                                                                   device=device)
        earlier = torch.arange(nb, device=device)[None, None, :] < own[:, None, None]
        score = torch.where(earlier, score, float("-inf"))
        k1 = min(topk - 1, nb)
        val, idx = torch.topk(score, k1, dim=-1)
        ids = torch.full((q_len, hkv, topk), -1, dtype=torch.int32, device=device)
        ids[..., :k1] = torch.where(val > float("-inf"), idx, -1).to(torch.int32)
        count = (val > float("-inf")).sum(-1, keepdim=True)
        ids.scatter_(-1, count, own[:, None, None].expand(q_len, hkv, 1).to(torch.int32))
        out.append(ids)
    return torch.cat(out).contiguous()


def reference(case, model_q: bool = False, chunk: int = 128):
    """Exact attention over the dequantised caches (fp32, natural-log LSE) on the selected blocks,
    causal; ``model_q``: q first rounded by the FP8 rule, as the kernel does (out, lse)."""
    q, ids, pt = case["q"].float(), case["topk_ids"].long(), case["page_table"].long()
    t, hq, d = q.shape
    if model_q:
        q = dequantize_rows(*quantize_rows(q))
    k = dequantize_rows(case["k_cache"], case["k_scale"])
    v = dequantize_rows(case["v_cache"], case["v_scale"])
    hkv, block = k.shape[1], k.shape[2]
    g = hq // hkv
    out = torch.zeros(t, hq, d, device=q.device)
    lse = torch.full((t, hq), float("-inf"), device=q.device)
    cu, seq = case["cu_seqlens_q"].tolist(), case["seq_lens_kv"].tolist()
    for r in range(len(seq)):
        kv_len, nb = seq[r], -(-seq[r] // block)
        kr = k[pt[r, :nb]].permute(1, 0, 2, 3).reshape(hkv, nb * block, d)[:, :kv_len]  # [Hkv, S, d]
        vr = v[pt[r, :nb]].permute(1, 0, 2, 3).reshape(hkv, nb * block, d)[:, :kv_len]
        for a in range(cu[r], cu[r + 1], chunk):
            b = min(a + chunk, cu[r + 1])
            pos = kv_len - (cu[r + 1] - cu[r]) + torch.arange(a - cu[r], b - cu[r], device=q.device)
            sel = torch.zeros(b - a, hkv, nb + 1, dtype=torch.bool, device=q.device)
            sel.scatter_(-1, torch.where(ids[a:b] >= 0, ids[a:b], nb), True)
            keys = torch.arange(kv_len, device=q.device)
            mask = sel[..., :nb].repeat_interleave(block, -1)[..., :kv_len] & (keys <= pos[:, None])[:, None, :]
            qc = q[a:b].view(b - a, hkv, g, d)
            s = torch.einsum("thgd,hsd->thgs", qc, kr) / math.sqrt(d)
            s = s.masked_fill(~mask[:, :, None, :], float("-inf"))
            lse[a:b] = torch.logsumexp(s, -1).view(b - a, hq)
            p = torch.softmax(s, -1).nan_to_num(0.0)
            out[a:b] = torch.einsum("thgs,hsd->thgd", p, vr).reshape(b - a, hq, d)
    return out, lse


def emulate_q8kv8(case, chunk: int = 128, block_n: int | None = None):
    """The kernel's rounding in torch (CPU-sized): e4m3 Q per row, and per step of ``block_n`` keys of a
    block ``P * v_scale * 256 / vmax`` rounded to e4m3 (P after the row's final max, the same rounding the
    online max gives up to the last factor): what the tolerances above are measured from."""
    case = dict(case, q=dequantize_rows(*quantize_rows(case["q"].float())))
    q, ids, pt = case["q"], case["topk_ids"].long(), case["page_table"].long()
    t, hq, d = q.shape
    k = dequantize_rows(case["k_cache"], case["k_scale"])
    hkv, block = k.shape[1], k.shape[2]
    bn = block_n or block
    g = hq // hkv
    out = torch.zeros(t, hq, d)
    cu, seq = case["cu_seqlens_q"].tolist(), case["seq_lens_kv"].tolist()
    for r in range(len(seq)):
        kv_len, nb = seq[r], -(-seq[r] // block)
        kr = k[pt[r, :nb]].permute(1, 0, 2, 3).reshape(hkv, nb * block, d)
        v8 = case["v_cache"][pt[r, :nb]].permute(1, 0, 2, 3).reshape(hkv, nb * block, d).float()
        vs = case["v_scale"][pt[r, :nb]].permute(1, 0, 2).reshape(hkv, nb * block)
        vs = torch.where(torch.arange(nb * block) < kv_len, vs, 0.0)
        vmax = vs.view(hkv, -1, bn).amax(-1).clamp(min=1e-30).repeat_interleave(bn, -1)  # per step
        for a in range(cu[r], cu[r + 1], chunk):
            b = min(a + chunk, cu[r + 1])
            pos = kv_len - (cu[r + 1] - cu[r]) + torch.arange(a - cu[r], b - cu[r])
            sel = torch.zeros(b - a, hkv, nb + 1, dtype=torch.bool)
            sel.scatter_(-1, torch.where(ids[a:b] >= 0, ids[a:b], nb), True)
            mask = sel[..., :nb].repeat_interleave(block, -1) & (torch.arange(nb * block) <= pos[:, None])[:, None]
            s = torch.einsum("thgd,hsd->thgs", q[a:b].view(b - a, hkv, g, d), kr) / math.sqrt(d)
            s = s.masked_fill(~mask[:, :, None, :], float("-inf"))
            p = torch.exp(s - s.amax(-1, keepdim=True))
            p8 = (p * (vs * (256 / vmax))[None, :, None, :]).to(FP8).float()
            o = torch.einsum("thgs,hsd->thgd", p8 * (vmax / 256)[None, :, None, :], v8) / p.sum(-1, keepdim=True)
            out[a:b] = o.reshape(b - a, hq, d)
    return out


def errors(ref_out, ref_lse, out, lse) -> tuple[float, float, float]:
    """(relative RMS of out, max |out - ref| / max |ref|, max |lse - ref| over finite references)."""
    ref_out, out = ref_out.float(), out.float()
    rms = float((out - ref_out).pow(2).mean().sqrt() / ref_out.pow(2).mean().sqrt().clamp(min=1e-30))
    mx = float((out - ref_out).abs().max() / ref_out.abs().max().clamp(min=1e-30))
    fin = torch.isfinite(ref_lse)
    dl = float((lse[fin] - ref_lse[fin]).abs().max()) if fin.any() else 0.0
    if not torch.isfinite(out).all() or not torch.equal(torch.isfinite(lse), fin):
        return float("nan"), float("nan"), float("nan")
    return rms, mx, dl


def gluon_plan(tile_q=8, block_n=128, stages=2, q_tma=True, group=True, rare_max=2, rare=True, device="cuda"):
    """A Gluon ``PrefillPlan`` spelled out (not ``plan_prefill``'s choice: these tests pick each knob)."""
    from kernels._common.device import sm_count
    from kernels.sparse_prefill.plan import PrefillPlan

    sms = sm_count(torch.device(device))
    return PrefillPlan(kernel="gluon", tile_q=tile_q, rare_max=rare_max if rare else 0,
                       rare_pass="items" if rare and rare_max else None, group=group, block_n=block_n,
                       num_stages=stages, q_tma=q_tma, programs=sms, rare_programs=sms)


def run_gluon_fp8(plan, case, out=None, lse=None):
    """``launch.launch``'s tile design step by step with the scales passed (bf16 caches: ``case`` without
    ``k_scale`` / ``v_scale``): unions, tile kernel, items pass (``plan.rare_pass`` "items" or None)."""
    from kernels._common.tiles import tile_table
    from kernels.sparse_prefill.launch import gluon_launchers, plan_unions
    from kernels.sparse_prefill.rare_items import build_rare_items

    q = case["q"]
    out = torch.full_like(q, float("nan")) if out is None else out
    lse = torch.full(q.shape[:2], float("nan"), device=q.device) if lse is None else lse
    qk_scale = 1.4426950408889634 / math.sqrt(q.shape[-1])
    tiles = tile_table(case["cu_seqlens_q"], q.shape[0], plan.tile_q, longest_first=False)
    union = plan_unions(plan, case["topk_ids"], case["page_table"], case["cu_seqlens_q"], tiles)
    args = (case["cu_seqlens_q"], case["seq_lens_kv"])
    tile, rare = gluon_launchers(case["k_cache"], case.get("k_scale"), case.get("v_scale"))
    tile(plan, q, case["k_cache"], case["v_cache"], out, lse, *args, tiles, union, qk_scale)
    if plan.rare_pass == "items":
        items = build_rare_items(union.rare_ids, case["page_table"], case["cu_seqlens_q"], plan.tile_q)
        rare(plan, q, case["k_cache"], case["v_cache"], out, lse, *args, items, qk_scale)
    return out, lse


def reference_rows(case, rows: torch.Tensor, model_q: bool = False, chunk: int = 64):
    """``reference`` on the tokens ``rows`` of a one-request case only, gathering each token's selected
    blocks (long contexts: the dense masked form would cost T x S): (out, lse) ``[len(rows), Hq, ...]``."""
    q, pt = case["q"][rows].float(), case["page_table"][0].long()
    if model_q:
        q = dequantize_rows(*quantize_rows(q))
    kv_len = int(case["seq_lens_kv"][0])
    t_all = case["q"].shape[0]
    hkv, block, d = case["k_cache"].shape[1], case["k_cache"].shape[2], q.shape[-1]
    nb = -(-kv_len // block)
    k = dequantize_rows(case["k_cache"][pt[:nb]], case["k_scale"][pt[:nb]]).permute(1, 0, 2, 3).reshape(hkv, -1, d)
    v = dequantize_rows(case["v_cache"][pt[:nb]], case["v_scale"][pt[:nb]]).permute(1, 0, 2, 3).reshape(hkv, -1, d)
    g = q.shape[1] // hkv
    outs, lses = [], []
    for a in range(0, rows.numel(), chunk):
        r = rows[a:a + chunk]
        ids = case["topk_ids"][r].long()  # [c, Hkv, k]
        pos = kv_len - t_all + r
        keys = (ids.clamp(min=0)[..., None] * block + torch.arange(block, device=q.device)).flatten(2)
        ok = (ids >= 0).repeat_interleave(block, -1) & (keys <= pos[:, None, None])
        h = torch.arange(hkv, device=q.device)[None, :, None]
        kk, vv = k[h, keys], v[h, keys]  # [c, Hkv, k * B, d]
        s = torch.einsum("chgd,chsd->chgs", q[a:a + chunk].view(-1, hkv, g, d), kk) / math.sqrt(d)
        s = s.masked_fill(~ok[:, :, None, :], float("-inf"))
        lses.append(torch.logsumexp(s, -1).flatten(1))
        outs.append(torch.einsum("chgs,chsd->chgd", torch.softmax(s, -1), vv).flatten(1, 2))
    return torch.cat(outs), torch.cat(lses)


CASES = [  # id, (q_lens, kv_lens, hkv, group, d, block, topk), plan options
    ("m3-8k-tile+items", ([8192], [8192], 4, 16, 128, 128, 16), {}),
    ("m3-32k-chunk-after-prefix", ([3000, 1100], [32768, 1100], 4, 16, 128, 128, 16), {}),
    ("m3-6k-bn64-3stages-q-by-consumers", ([1500, 700], [6000, 700], 4, 16, 128, 128, 16),
     dict(block_n=64, stages=3, q_tma=False, group=False, rare=False)),
    ("d64-b128-4k-g8-tq16-bn32", ([700, 37], [4096, 300], 3, 8, 64, 128, 8), dict(tile_q=16, block_n=32)),
]


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
@pytest.mark.parametrize("shape,opts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_gluon_q8kv8_matches_dequantised_reference(shape, opts):
    q_lens, kv_lens, hkv, group, d, block, topk = shape
    case = fp8_case(q_lens, kv_lens, hkv, group, d, block, topk, seed=len(q_lens) + group)
    out, lse = run_gluon_fp8(gluon_plan(**opts), case)
    _check(case, out, lse)


def _check(case, out, lse):
    assert out.dtype == torch.bfloat16
    q_out, q_lse = reference(case, model_q=True)
    rms, mx, dl = errors(q_out, q_lse, out, lse)
    ref_out, ref_lse = reference(case)
    exact = errors(ref_out, ref_lse, out, lse)[0]
    assert rms < OUT_RMS and dl < LSE_ABS and exact < EXACT_RMS, (
        f"out rel rms {rms:.4f} (max {mx:.4f}, exact reference {exact:.4f}), lse max err {dl:.4f}")


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU (sm_90)")
def test_gluon_q8kv8_rare_pass_merges_into_the_tile_output():
    # rare_max 4: most pairs leave the unions for the items pass (several rounds), merged into the tile
    # kernel's output by LSE
    case = fp8_case([1024], [5000], 4, 16, 128, 128, 16, seed=3)
    plan = gluon_plan(rare_max=4)
    out, lse = run_gluon_fp8(plan, case)
    _check(case, out, lse)
    from kernels._common.tiles import tile_table
    from kernels.sparse_prefill.launch import plan_unions

    union = plan_unions(plan, case["topk_ids"], case["page_table"], case["cu_seqlens_q"],
                        tile_table(case["cu_seqlens_q"], 1024, 8, longest_first=False))
    assert union.rare_ids is not None and int((union.rare_ids >= 0).sum()) > 1000  # pairs for the items pass


@pytest.mark.parametrize("change,match", [
    (dict(k_scale=None), "need k_scale and v_scale"),
    (dict(v_scale="half"), r"v_scale must be fp32 \[num_pages, Hkv, B\]"),
    (dict(v_cache="bf16"), "K and V caches must both be float8_e4m3fn or neither"),
    (dict(k_cache="bf16", v_cache="bf16"), "go with float8_e4m3fn K/V caches only"),  # scales with bf16 caches
])
def test_q8kv8_mixed_inputs_are_one_line_value_errors(change, match):
    # (checked before anything touches a GPU: runs on the CPU; `gluon_launchers` picks Q8KV8 once scales are given)
    from kernels.sparse_prefill.launch import gluon_launchers

    case = fp8_case([20], [300], 1, 16, 64, 64, 4, device="cpu")
    for name, what in change.items():
        if what == "bf16":
            case[name] = dequantize_rows(case[name], case[name[0] + "_scale"], torch.bfloat16)
        elif what == "half":
            case[name] = case[name][:, :, : case[name].shape[2] // 2].contiguous()
        else:
            case[name] = what
    plan: Any = None  # (not reached)
    args = (case["q"], case["k_cache"], case["v_cache"], case["q"], None, case["cu_seqlens_q"], case["seq_lens_kv"])
    tile, rare = gluon_launchers(case["k_cache"], case["k_scale"], case["v_scale"])
    with pytest.raises(ValueError, match=match):
        tile(plan, *args, plan, plan, 0.1)
    with pytest.raises(ValueError, match=match):
        rare(plan, *args, plan, 0.1)


def test_emulated_rounding_is_within_the_tolerances_and_the_reference_sees_fp8():
    # the CPU measurement behind the bounds (the kernel's rounding model against both references), and
    # references that cannot pass a wrong rule: q rounded by the FP8 rule moves the output measurably
    case = fp8_case([300, 45], [900, 45], 2, 16, 64, 64, 8, seed=1, device="cpu")
    ref_out, ref_lse = reference(case)
    q_out, q_lse = reference(case, model_q=True)
    for bn in (64, 32):
        emu = emulate_q8kv8(case, block_n=bn)
        rms_q, rms = errors(q_out, q_lse, emu, q_lse)[0], errors(ref_out, ref_lse, emu, ref_lse)[0]
        assert 0.005 < rms_q < OUT_RMS * 0.6 and rms < EXACT_RMS * 0.5, (bn, rms_q, rms)
    assert 0.005 < errors(ref_out, ref_lse, q_out, ref_lse)[0] < EXACT_RMS * 0.5
    assert float((q_lse - ref_lse).abs().max()) > LSE_ABS  # (why the LSE is held to the model_q one)
