"""Sparse and dense paged decode attention: Triton (interpreter on CPU) against the fp32 references."""
import pytest
import torch

from kernels.decode import (
    DecodeTuning,
    DenseDecodePlan,
    MSADecodePlan,
    decode_indexer_ref,
    dense_decode_attention,
    dense_decode_attention_ref,
    msa_decode_attention,
    sparse_decode_attention_ref,
)
from kernels.testing import assert_close, decode_case, random_topk_ids

PAGE = 64


def attention_plan(cls, case, splits, **extra):
    hq, d = case.q.shape[1], case.q.shape[2]
    plan = cls(hq, case.k_cache.shape[1], d, PAGE, device="cpu", dtype=case.q.dtype, return_lse=True,
               impl="triton", tuning=DecodeTuning(attn_splits=splits), **extra)
    plan.plan(case.seq_lens, case.page_table, case.q_len)
    plan.out.fill_(float("nan"))
    plan.lse.fill_(float("nan"))
    return plan


# (seq_lens, q_len, Hkv, G, d, k, splits): short and long requests, one shorter than a page
CASES = [
    ([1, 70, 640, 130], 1, 2, 1, 64, 4, 3),
    ([9, 200, 700], 8, 1, 3, 128, 5, 2),
    ([20, 390], 8, 1, 16, 64, 4, 1),
    ([16, 300], 16, 1, 16, 128, 3, 4),
]


def _case(seq_lens, q_len, hkv, group, d, seed, **kw):
    return decode_case(seq_lens, q_len, hkv=hkv, group=group, d=d, block=PAGE, d_idx=16, seed=seed, **kw)


@pytest.mark.parametrize("seq_lens,q_len,hkv,group,d,topk,splits", CASES)
def test_sparse_attention_matches_reference(seq_lens, q_len, hkv, group, d, topk, splits):
    case = _case(seq_lens, q_len, hkv, group, d, seed=q_len + d, poison=True)
    ids = random_topk_ids(seq_lens, q_len, PAGE, hkv, topk, seed=1, empty_rows=1)
    plan = attention_plan(MSADecodePlan, case, splits, topk=max(2, topk), index_dim=16)
    out = plan.run_attention(case.q, case.k_cache, case.v_cache, topk_ids=ids)
    ref, ref_lse = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, ids, case.page_table,
                                               case.seq_lens, q_len)
    assert_close("out", ref, out)
    assert_close("lse", ref_lse, plan.lse, 1e-3, atol=1e-3)
    empty = ids.view(-1, topk)[0]  # first (token, head) row is all -1: zero output, -inf LSE
    assert (empty == -1).all() and (out[0, :group] == 0).all() and torch.isinf(plan.lse[0, :group]).all()


@pytest.mark.parametrize("seq_lens,q_len,hkv,group,d,topk,splits", CASES)
def test_dense_attention_matches_reference(seq_lens, q_len, hkv, group, d, topk, splits):
    case = _case(seq_lens, q_len, hkv, group, d, seed=q_len + d + 1, poison=True)
    plan = attention_plan(DenseDecodePlan, case, splits)
    out = plan.run(case.q, case.k_cache, case.v_cache)
    ref, ref_lse = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table,
                                              case.seq_lens, q_len)
    assert_close("out", ref, out)
    assert_close("lse", ref_lse, plan.lse, 1e-3, atol=1e-3)


def test_topk_covering_all_pages_equals_dense():
    seq_lens, q_len, hkv, group, d = [8, 200, 450], 8, 2, 3, 64
    case = decode_case(seq_lens, q_len, hkv=hkv, group=group, d=d, block=PAGE, d_idx=32, seed=21, poison=True)
    topk = max(-(-s // PAGE) for s in seq_lens) + 1
    ids = decode_indexer_ref(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, q_len, topk)
    sparse, sparse_lse = msa_decode_attention(case.q, case.k_cache, case.v_cache, ids, case.page_table,
                                              case.seq_lens, q_len, return_lse=True, impl="triton", num_splits=2)
    dense, dense_lse = dense_decode_attention(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens,
                                              q_len, return_lse=True, impl="triton", num_splits=3)
    ref, ref_lse = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens,
                                              q_len)
    assert_close("sparse out", ref, sparse)
    assert_close("dense out", ref, dense)
    assert_close("sparse vs dense", dense.float(), sparse, atol=2e-2)
    assert_close("sparse lse", ref_lse, sparse_lse, 1e-3, atol=1e-3)
    assert_close("dense lse", ref_lse, dense_lse, 1e-3, atol=1e-3)


def test_auto_on_cpu_runs_the_reference_and_keeps_dtype():
    case = _case([5, 150], 2, 2, 2, 64, seed=4)
    ids = random_topk_ids([5, 150], 2, PAGE, 2, 4, seed=2)
    out = msa_decode_attention(case.q, case.k_cache, case.v_cache, ids, case.page_table, case.seq_lens, 2)
    ref, _ = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, ids, case.page_table, case.seq_lens, 2)
    assert out.dtype == case.q.dtype and torch.equal(out, ref.to(case.q.dtype))
    dense = dense_decode_attention(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens, 2)
    dref, _ = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens, 2)
    assert torch.equal(dense, dref.to(case.q.dtype))


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda c, ids: dict(q=c.q.float()), "share one dtype"),
        (lambda c, ids: dict(q=c.q[:, :3]), "multiple of the KV heads"),
        (lambda c, ids: dict(k_cache=c.k_cache[..., :32]), "v_cache d is 64, expected 32"),
        (lambda c, ids: dict(k_cache=c.k_cache[0]), "must be \\[num_pages, Hkv, B, d\\]"),
        (lambda c, ids: dict(topk_ids=ids.long()), "topk_ids must be int32"),
        (lambda c, ids: dict(topk_ids=ids[:, :1]), "token-major"),
        (lambda c, ids: dict(q_len=17), "q_len must be an int in 1..16"),
        (lambda c, ids: dict(seq_lens=torch.tensor([5, 9000], dtype=torch.int32)), "page-table capacity"),
        (lambda c, ids: dict(page_table=c.page_table + 1000), "page ids outside"),
    ],
)
def test_bad_input_raises_value_error(mutate, match):
    case = _case([5, 150], 2, 2, 2, 64, seed=4)
    ids = random_topk_ids([5, 150], 2, PAGE, 2, 4, seed=2)
    args = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, topk_ids=ids, page_table=case.page_table,
                seq_lens=case.seq_lens, q_len=2, impl="triton")
    args.update(mutate(case, ids))
    with pytest.raises(ValueError, match=match):
        msa_decode_attention(**args)
