"""plan/run lifecycle of the decode wrappers and the choices they make (CPU: interpreter and torch paths)."""
import pytest
import torch

import kernels.decode.plan as plan_mod
from kernels.decode import (
    DecodeTuning,
    DenseDecodePlan,
    MSADecodePlan,
    decode_indexer_ref,
    dense_decode_attention_ref,
    sparse_decode_attention_ref,
)
from kernels.testing import assert_close, decode_case, make_page_table

PAGE = 64


def msa_plan(impl="triton", **kw):
    return MSADecodePlan(6, 2, 64, PAGE, topk=4, index_dim=32, device="cpu", impl=impl,
                         tuning=DecodeTuning(attn_splits=2, index_splits=3), **kw)


def _case(seq_lens, q_len, d_idx, seed, **kw):
    return decode_case(seq_lens, q_len, hkv=2, group=3, d=64, block=PAGE, d_idx=d_idx, seed=seed, **kw)


def check_step(plan, case):
    out = plan.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
    ids = decode_indexer_ref(case.q_idx, case.k_idx_cache, plan.page_table, plan.seq_lens, case.q_len, 4)
    assert torch.equal(plan.topk_ids, ids)
    ref, _ = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, ids, plan.page_table, plan.seq_lens,
                                         case.q_len)
    assert_close("out", ref, out)
    return out


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_replan_same_sizes_updates_metadata_in_place(impl):
    q_len = 2
    case = _case([70, 600, 9], q_len, 32, seed=1, max_pages=12)
    plan = msa_plan(impl)
    plan.plan(case.seq_lens, case.page_table, q_len)
    buffers = [t.data_ptr() for t in (plan.seq_lens, plan.page_table, plan.out, plan.topk_ids)]
    check_step(plan, case)
    # next step: every request grew and pages were re-scattered; same sizes -> same buffers
    new_lens = [71, 700, 300]
    case.page_table = make_page_table(3, 12, case.k_cache.shape[0], torch.Generator().manual_seed(5))
    case.seq_lens = torch.tensor(new_lens, dtype=torch.int32)
    plan.plan(case.seq_lens, case.page_table, q_len)
    assert [t.data_ptr() for t in (plan.seq_lens, plan.page_table, plan.out, plan.topk_ids)] == buffers
    assert plan.seq_lens.tolist() == new_lens
    check_step(plan, case)


def test_new_sizes_reallocate_and_launches_depend_only_on_sizes():
    plan = MSADecodePlan(6, 2, 64, PAGE, topk=4, index_dim=32, device="cpu", impl="triton")
    case = _case([70, 600], 1, 32, seed=2, max_pages=12)
    plan.plan(case.seq_lens, case.page_table, 1)
    launches = (plan.attention_launch, plan.indexer_launch)
    plan.plan(torch.tensor([1, 1], dtype=torch.int32), case.page_table, 1)
    assert (plan.attention_launch, plan.indexer_launch) == launches
    plan.plan(case.seq_lens, case.page_table, 2)
    assert plan.out.shape[0] == 4 and plan.topk_ids.shape == (4, 2, 4)
    assert plan.indexer_launch.rows == 16 and plan.attention_launch.rows == 16


def test_plan_makes_the_choices_once():
    """impl, index keys and launch knobs are fixed by the constructor and plan(); run() reads them."""
    case = _case([70, 600], 1, 32, seed=2, max_pages=12)
    auto = MSADecodePlan(6, 2, 64, PAGE, topk=4, index_dim=32, device="cpu")
    assert auto.impl == "torch" and auto.index_dtype == torch.bfloat16
    fp8 = MSADecodePlan(6, 2, 64, PAGE, topk=16, index_dim=32, device="cpu", impl="triton",
                        index_dtype=torch.float8_e4m3fn, tuning=DecodeTuning(pages_per_iter=4, attn_stages=2))
    fp8.plan(case.seq_lens, case.page_table, 1)
    ix, at = fp8.indexer_launch, fp8.attention_launch
    assert (ix.fp8_keys, ix.fp8_dot, ix.dot_fp32, ix.pages_per_iter, ix.keep) == (True, False, True, 4, 16)
    assert (at.num_stages, at.num_warps, at.dot_fp32, at.precision) == (2, 4, True, "ieee")
    # pipeline depth: fp8 K/V pages take the deeper FP8 pipeline on the small tiles, bf16 keeps its depths
    fp8kv = {"kv_dtype": torch.float8_e4m3fn, "device": "cpu", "impl": "triton"}
    for cls, bf16_stages in ((MSADecodePlan, plan_mod.SPARSE_STAGES), (DenseDecodePlan, 2)):
        p16, p8 = cls(6, 2, 64, PAGE, device="cpu", impl="triton"), cls(6, 2, 64, PAGE, **fp8kv)
        for p in (p16, p8):
            p.plan(case.seq_lens, case.page_table, 1)
        assert (p16.attention_launch.num_stages, p8.attention_launch.num_stages) == \
            (bf16_stages, plan_mod.FP8_ATTN_STAGES)
    i8 = MSADecodePlan(6, 2, 64, PAGE, topk=4, index_dim=32, device="cpu", impl="triton", index_dtype=torch.int8)
    i8.plan(case.seq_lens, case.page_table, 1)
    assert (i8.indexer_launch.int8_keys, i8.indexer_launch.fp8_keys, i8.indexer_launch.pages_per_iter) == \
        (True, False, 1)
    dense = DenseDecodePlan(6, 2, 64, PAGE, device="cpu", impl="triton")
    dense.plan(case.seq_lens, case.page_table, 16)  # 16 tokens x 3 heads = 48 rows -> one 64-row block
    assert (dense.attention_launch.rows, dense.attention_launch.row_blocks, dense.attention_launch.num_warps) == \
        (64, 1, 8)


def test_dense_plan_replan():
    case = _case([70, 600], 3, 16, seed=3, max_pages=12)
    plan = DenseDecodePlan(6, 2, 64, PAGE, device="cpu", impl="triton", tuning=DecodeTuning(attn_splits=2))
    for lens in ([70, 600], [3, 700]):
        case.seq_lens = torch.tensor(lens, dtype=torch.int32)
        plan.plan(case.seq_lens, case.page_table, 3)
        plan.out.fill_(float("nan"))
        out = plan.run(case.q, case.k_cache, case.v_cache)
        ref, _ = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens, 3)
        assert_close("out", ref, out)


def test_plan_inside_graph_capture_raises(monkeypatch):
    monkeypatch.setattr(plan_mod, "in_graph_capture", lambda: True)
    case = _case([70], 1, 32, seed=0)
    with pytest.raises(RuntimeError, match="outside CUDA graph capture"):
        msa_plan().plan(case.seq_lens, case.page_table, 1)


def test_run_before_plan_and_mismatched_tensors_raise():
    case = _case([70, 130], 1, 32, seed=0)
    plan = msa_plan()
    with pytest.raises(RuntimeError, match="call plan"):
        plan.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
    plan.plan(case.seq_lens, case.page_table, 1)
    with pytest.raises(ValueError, match="tokens, expected R\\*q_len = 2"):
        plan.run(case.q[:1], case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
    with pytest.raises(ValueError, match="plan expects"):
        plan.run_indexer(case.q_idx[..., :16].contiguous(), case.k_idx_cache[..., :16].contiguous())
    with pytest.raises(ValueError, match="out must be"):
        plan.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache, out=case.q.float())
    with pytest.raises(ValueError, match="q_len must be"):
        plan.plan(case.seq_lens, case.page_table, 0)


def test_constructor_rejects_bad_sizes():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        MSADecodePlan(6, 4, 64, PAGE, device="cpu")
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        DenseDecodePlan(6, 2, 96, PAGE, device="cpu")
    with pytest.raises(ValueError, match="impl must be"):
        DenseDecodePlan(6, 2, 64, PAGE, device="cpu", impl="cuda")
    with pytest.raises(ValueError, match="index_dtype must be"):
        MSADecodePlan(6, 2, 64, PAGE, device="cpu", index_dtype=torch.int16)
