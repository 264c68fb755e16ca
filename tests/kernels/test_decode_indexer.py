"""Decode indexer: Triton (interpreter on CPU) against the fp32 torch reference."""
import pytest
import torch

from kernels.decode import (
    DecodeTuning,
    MSADecodePlan,
    decode_indexer_ref,
    dequantized_int8_queries,
    msa_decode_indexer,
    quantize_index_keys,
    quantize_int8_rows,
)
from kernels.testing import POISON_KEY, assert_close, decode_case

SENTINEL = -7  # no valid output value: proves every output slot was written
WS_SENTINEL = 1 << 30  # larger than any page id: an unwritten workspace slot fails the "< own" check


def _case(seq_lens, q_len, heads, d_idx, seed=0, **kw):
    return decode_case(seq_lens, q_len, hkv=heads, group=1, d=16, block=64, d_idx=d_idx, seed=seed, **kw)


def run_plan(case, page, topk, splits, k_idx_scale=None, keys=None, pages_per_iter=None):
    heads, d_idx = case.q_idx.shape[1], case.q_idx.shape[2]
    keys = case.k_idx_cache if keys is None else keys
    plan = MSADecodePlan(heads, heads, 16, page, topk=topk, index_dim=d_idx, index_dtype=keys.dtype, device="cpu",
                         dtype=case.q_idx.dtype, impl="triton",
                         tuning=DecodeTuning(index_splits=splits, pages_per_iter=pages_per_iter))
    plan.plan(case.seq_lens, case.page_table, case.q_len)
    plan.topk_ids.fill_(SENTINEL)
    plan.ws_id.fill_(WS_SENTINEL)
    ids = plan.run_indexer(case.q_idx, keys, k_idx_scale)
    return plan, ids.clone()


@pytest.mark.parametrize(
    "seq_lens,q_len,heads,d_idx,topk,splits,ppi",
    [
        ([1, 63, 64, 65, 700, 1500], 1, 1, 32, 4, 3, 1),  # short and long, shorter than a page, G=any
        ([8, 60, 130, 1200, 520], 8, 4, 64, 5, 2, 2),  # MTP crossing a page boundary, k not a power of 2
        ([16, 1100, 300], 16, 2, 32, 6, 5, 4),  # q_len 16, more splits than some requests' pages
    ],
)
def test_indexer_matches_reference_and_never_touches_own_or_later_pages(seq_lens, q_len, heads, d_idx, topk, splits,
                                                                        ppi):
    """ppi = pages scored per loop iteration (a split's last iteration is then partly masked)."""
    page = 64
    case = _case(seq_lens, q_len, heads, d_idx, max_pages=30, seed=len(seq_lens) + q_len, poison=True)
    plan, ids = run_plan(case, page, topk, splits, pages_per_iter=ppi)
    ref = decode_indexer_ref(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, q_len, topk)
    assert (ids != SENTINEL).all()
    # poisoned pages (own page of the last query and later, unused pages) would win every top-k if read
    assert_close("ids", ref, ids)
    # no row ever recorded a candidate at or after its own page (workspace fully written)
    ws = plan.ws_id  # [T, H, S, KP]
    own = torch.tensor([(s - q_len + i) // page for s in seq_lens for i in range(q_len)])
    assert (ws < own[:, None, None, None]).all()


def test_reference_short_rows_take_every_page_in_order():
    """With own + 1 <= k candidates the ids are 0..own, then -1 (the decode contract)."""
    seq_lens, topk = [1, 63, 64, 65, 200, 700], 4
    case = _case(seq_lens, 1, 2, 32, seed=1)
    ids = decode_indexer_ref(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, 1, topk)
    for r, s in enumerate(seq_lens):
        own = (s - 1) // 64
        if own + 1 <= topk:
            assert ids[r].tolist() == [list(range(own + 1)) + [-1] * (topk - own - 1)] * 2
        else:
            assert (ids[r, :, -1] == own).all() and (ids[r, :, :-1] < own).all()


def test_indexer_ties_go_to_smaller_page_ids():
    page, topk = 64, 5
    case = _case([64 * 12 + 3], 1, 2, 32, seed=3)
    case.q_idx.zero_()
    case.k_idx_cache.zero_()
    for ppi in (1, 4):  # ties inside one multi-page iteration too
        _, ids = run_plan(case, page, topk, splits=4, pages_per_iter=ppi)
        assert ids[0].tolist() == [[0, 1, 2, 3, 12]] * 2


def test_indexer_fp8_keys_match_reference_on_same_quantized_keys():
    page, topk, q_len = 64, 4, 8
    seq_lens = [9, 900, 400]
    case = _case(seq_lens, q_len, 2, 32, seed=5)
    k8, scale = quantize_index_keys(case.k_idx_cache)
    assert k8.dtype == torch.float8_e4m3fn and scale.shape == case.k_idx_cache.shape[:2]
    plan, ids = run_plan(case, page, topk, splits=3, k_idx_scale=scale, keys=k8)
    assert plan.indexer_launch.fp8_keys and not plan.indexer_launch.fp8_dot  # the interpreter widens to fp16
    ref = decode_indexer_ref(case.q_idx, k8, case.page_table, case.seq_lens, q_len, topk, k_idx_scale=scale)
    assert_close("ids", ref, ids)


@pytest.mark.parametrize("ppi", [1, 2])
def test_indexer_int8_keys_match_reference_with_int8_queries(ppi):
    # the kernel rounds q to int8 per row and dots exactly; the reference scores the same rounded q
    page, topk, q_len = 64, 5, 8
    case = _case([9, 900, 400, 1300], q_len, 2, 32, seed=11, max_pages=30, poison=True)
    k8, scale = quantize_int8_rows(case.k_idx_cache)
    assert k8.dtype == torch.int8 and scale.shape == case.k_idx_cache.shape[:2]
    plan, ids = run_plan(case, page, topk, splits=3, k_idx_scale=scale, keys=k8, pages_per_iter=ppi)
    assert plan.indexer_launch.int8_keys
    ref = decode_indexer_ref(case.q_idx, k8, case.page_table, case.seq_lens, q_len, topk, k_idx_scale=scale)
    assert_close("ids", ref, ids)
    # the rounding of q is part of the rule: scoring unrounded q picks other pages somewhere
    q_deq = dequantized_int8_queries(case.q_idx)
    assert torch.equal(ref, decode_indexer_ref(q_deq, k8, case.page_table, case.seq_lens, q_len, topk,
                                               k_idx_scale=scale))
    assert (q_deq - case.q_idx.float()).abs().max() > 0


def test_int8_rule_rounds_to_nearest_and_keeps_the_row_max():
    x = torch.tensor([[1.0, -0.5, 0.25, 0.0], [3.0, 2.9, -3.0, 1e-3]])
    x8, scale = quantize_int8_rows(x)
    assert x8.abs().amax(-1).tolist() == [127, 127]
    assert torch.allclose(scale, x.abs().amax(-1) / 127)
    assert x8[0].tolist() == [127, -64, 32, 0]  # 63.5 -> 64 (even), 31.75 -> 32
    assert ((x8.float() * scale[:, None] - x).abs() <= scale[:, None] / 2 + 1e-7).all()
    with pytest.raises(ValueError, match="bf16/fp16/fp32"):
        quantize_int8_rows(x8)


def test_plain_function_auto_on_cpu_is_the_reference():
    case = _case([5, 700], 2, 2, 32, seed=7)
    ids = msa_decode_indexer(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, 2, topk=4)
    ref = decode_indexer_ref(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, 2, 4)
    assert torch.equal(ids, ref)
    tri = msa_decode_indexer(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, 2, topk=4, impl="triton")
    assert_close("ids", ref, tri)


def _call(case, **over):
    args = dict(q_idx=case.q_idx, k_idx_cache=case.k_idx_cache, page_table=case.page_table,
                seq_lens=case.seq_lens, q_len=case.q_len, topk=4, impl="triton")
    args.update(over)
    return msa_decode_indexer(**args)


@pytest.mark.parametrize(
    "override,match",
    [
        (dict(q_len=0), "q_len must be an int in 1..16"),
        (dict(q_len=17), "q_len must be an int in 1..16"),
        (dict(seq_lens=torch.tensor([2000, 5], dtype=torch.int32)), "exceeds the page-table capacity"),
        (dict(seq_lens=torch.tensor([1, 5], dtype=torch.int32)), "must be >= q_len"),
        (dict(seq_lens=torch.tensor([100, 5])), "seq_lens must be int32"),
        (dict(page_table="float"), "page_table must be int32"),
        (dict(q_idx="bad_tokens"), "tokens, expected R\\*q_len"),
        (dict(q_idx="fp16"), "must share one dtype"),
        (dict(k_idx_cache="fp8_no_scale"), "float8_e4m3fn index keys need k_idx_scale"),  # validate.check_index_scale
        (dict(topk=1), "topk must be in 2..64"),
        (dict(page_table="out_of_range"), "page ids outside"),
    ],
)
def test_bad_input_raises_value_error(override, match):
    case = _case([70, 200], 2, 2, 32, seed=9)
    special = {
        "float": case.page_table.float(),
        "bad_tokens": case.q_idx[:3],
        "fp16": case.q_idx.half(),
        "fp8_no_scale": case.k_idx_cache.to(torch.float8_e4m3fn),
        "out_of_range": case.page_table + 1000,
    }
    over = {k: special.get(v, v) if isinstance(v, str) else v for k, v in override.items()}
    with pytest.raises(ValueError, match=match):
        _call(case, **over)


def test_plan_index_keys_are_fixed_at_construction():
    case = _case([70, 200], 1, 2, 32, seed=9)
    plan = MSADecodePlan(2, 2, 16, 64, topk=4, index_dim=32, device="cpu", impl="triton")
    plan.plan(case.seq_lens, case.page_table, 1)
    k8, scale = quantize_index_keys(case.k_idx_cache)
    with pytest.raises(ValueError, match="plan was built for torch.bfloat16 index keys"):
        plan.run_indexer(case.q_idx, k8, scale)


def test_triton_on_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = _case([70], 1, 1, 32)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        _call(case)


def test_poison_value_is_large_enough_to_win():
    # sanity of the poison itself: a poisoned page scored by the reference would be selected
    case = _case([64 * 6 + 1], 1, 1, 32, seed=11, poison=True)
    keys = case.k_idx_cache.clone()
    keys[case.page_table[0, 2]] = POISON_KEY
    ids = decode_indexer_ref(case.q_idx, keys, case.page_table, case.seq_lens, 1, 3)
    assert ids[0, 0, 0].item() == 2
