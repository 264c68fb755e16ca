"""plan/run lifecycle of the decode wrappers (CPU: interpreter and torch paths)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels.decode.plan as plan_mod  # noqa: E402
from kernels.decode import (  # noqa: E402
    DenseDecodePlan,
    MSADecodePlan,
    decode_indexer_ref,
    dense_decode_attention_ref,
    sparse_decode_attention_ref,
)
from kernels.decode.inputs import make_decode_case, make_page_table  # noqa: E402

PAGE = 64


def msa_plan(impl="triton", **kw):
    return MSADecodePlan(6, 2, 64, PAGE, topk=4, index_dim=32, device="cpu", impl=impl,
                         num_splits=2, indexer_splits=3, **kw)


def check_step(plan, case):
    out = plan.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
    ids = decode_indexer_ref(case.q_idx, case.k_idx_cache, plan.page_table, plan.seq_lens, case.q_len, 4)
    assert torch.equal(plan.topk_ids, ids)
    ref, _ = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, ids, plan.page_table, plan.seq_lens,
                                         case.q_len)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert not torch.isnan(out).any() and err < 1e-2
    return out


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_replan_same_sizes_updates_metadata_in_place(impl):
    q_len = 2
    case = make_decode_case([70, 600, 9], q_len, 6, 2, 64, PAGE, 32, max_pages=12, seed=1, spare_pages=8)
    plan = msa_plan(impl)
    plan.plan(case.seq_lens, case.page_table, q_len)
    buffers = [t.data_ptr() for t in (plan.seq_lens, plan.page_table, plan.out, plan.topk_ids)]
    check_step(plan, case)
    # next step: every request grew and pages were re-scattered; same sizes -> same buffers
    new_lens = [71, 700, 300]
    table, _ = make_page_table(new_lens, PAGE, 12, case.k_cache.shape[0], torch.Generator().manual_seed(5))
    case.seq_lens = torch.tensor(new_lens, dtype=torch.int32)
    case.page_table = table
    plan.plan(case.seq_lens, case.page_table, q_len)
    assert [t.data_ptr() for t in (plan.seq_lens, plan.page_table, plan.out, plan.topk_ids)] == buffers
    assert plan.seq_lens.tolist() == new_lens
    check_step(plan, case)


def test_new_sizes_reallocate_and_split_counts_depend_only_on_sizes():
    plan = MSADecodePlan(6, 2, 64, PAGE, topk=4, index_dim=32, device="cpu", impl="triton")
    case = make_decode_case([70, 600], 1, 6, 2, 64, PAGE, 32, max_pages=12, seed=2)
    plan.plan(case.seq_lens, case.page_table, 1)
    splits = (plan.attn_splits, plan.index_splits)
    plan.plan(torch.tensor([1, 1], dtype=torch.int32), case.page_table, 1)
    assert (plan.attn_splits, plan.index_splits) == splits
    plan.plan(case.seq_lens, case.page_table, 2)
    assert plan.out.shape[0] == 4 and plan.topk_ids.shape == (4, 2, 4)


def test_dense_plan_replan():
    case = make_decode_case([70, 600], 3, 6, 2, 64, PAGE, 16, max_pages=12, seed=3)
    plan = DenseDecodePlan(6, 2, 64, PAGE, device="cpu", impl="triton", num_splits=2)
    for lens in ([70, 600], [3, 700]):
        case.seq_lens = torch.tensor(lens, dtype=torch.int32)
        plan.plan(case.seq_lens, case.page_table, 3)
        plan.out.fill_(float("nan"))
        out = plan.run(case.q, case.k_cache, case.v_cache)
        ref, _ = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens, 3)
        assert not torch.isnan(out).any() and ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_plan_inside_graph_capture_raises(monkeypatch):
    monkeypatch.setattr(plan_mod, "in_graph_capture", lambda: True)
    case = make_decode_case([70], 1, 6, 2, 64, PAGE, 32)
    with pytest.raises(RuntimeError, match="outside CUDA graph capture"):
        msa_plan().plan(case.seq_lens, case.page_table, 1)


def test_run_before_plan_and_mismatched_tensors_raise():
    case = make_decode_case([70, 130], 1, 6, 2, 64, PAGE, 32)
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
