"""The Triton indexer against the fp32 reference (interpreter on CPU, small sizes; larger on GPU)."""
import pytest
import torch

from kernels.indexer import launch, msa_indexer, naive, plan_indexer
from kernels.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _args(case):
    return (case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])


CASES = [  # q_lens, kv_lens (prefix = kv - q), H, d_idx, B, topk
    ([70, 5, 33], [262, 5, 400], 3, 64, 64, 4),
    ([130], [900], 4, 128, 128, 8),
    ([40, 1], [40, 300], 1, 64, 64, 16),
    ([17, 60], [1100, 700], 2, 64, 64, 32),
]


@pytest.mark.parametrize("q_lens,kv_lens,h,d_idx,block,topk", CASES)
def test_indexer_kernel_matches_reference(paged_case, q_lens, kv_lens, h, d_idx, block, topk):
    case = paged_case(q_lens, kv_lens, hkv=h, d_idx=d_idx, block=block, seed=topk, device=DEV)
    args = _args(case)
    ids = msa_indexer(*args, topk, impl="triton")
    ref = naive.indexer_paged_reference(*args, topk)
    assert_close("ids", ref, ids, scores=naive.paged_block_scores(*args))


def test_indexer_ties_and_lse(paged_case):
    case = paged_case([9, 24], [9 + 18 * 64, 100], hkv=2, d_idx=64, block=64, device=DEV)
    case["q_idx"][:9].zero_()  # all-zero scores for request 0: ties everywhere
    args = _args(case)
    ids, lse = msa_indexer(*args, 16, impl="triton", return_lse=True)
    assert ids[:9, :].tolist() == [[list(range(15)) + [18]] * 2] * 9
    ref_ids, ref_lse = naive.indexer_paged_reference(*args, 16, return_lse=True)
    assert_close("ids", ref_ids, ids)
    assert_close("lse", ref_lse, lse, 1e-3, atol=2e-3)


def test_block_score_output_matches_reference(paged_case):
    case = paged_case([50, 3], [300, 130], hkv=3, d_idx=64, block=64, device=DEV)
    args = _args(case)
    got = launch(plan_indexer(case["q_idx"], case["k_idx_cache"], 4, impl="triton", output="block_scores"), *args)
    ref = naive.paged_block_scores(*args)
    ref = torch.nn.functional.pad(ref, (0, got.shape[-1] - ref.shape[-1]), value=float("-inf"))
    local = torch.cat([(300 - 50 + torch.arange(50)) // 64, (130 - 3 + torch.arange(3)) // 64])
    history = (torch.arange(got.shape[-1])[None, :] < local[:, None])[:, None, :].expand_as(got)
    assert_close("block scores", ref.cpu()[history], got.cpu()[history], 1e-5, atol=1e-4)  # history only
    assert torch.isinf(got.cpu()[~history]).all()
    sums = launch(plan_indexer(case["q_idx"], case["k_idx_cache"], 4, impl="triton", output="score_sum"), *args)
    assert_close("score sums", torch.where(history, ref.cpu(), 0.0).sum(-1), sums.cpu(), 1e-5)


def test_plan_decides_impl_and_outputs(paged_case):
    case = paged_case([10], [100], hkv=2, d_idx=64, block=64)
    plan = plan_indexer(case["q_idx"], case["k_idx_cache"], 8)
    assert (plan.impl, plan.tokens_per_tile, plan.block, plan.check_lengths) == ("torch", 64, 64, True)
    dev = paged_case([10], [100], hkv=2, d_idx=64, block=64, device=DEV)  # Triton plans: a GPU or the interpreter
    unchecked = plan_indexer(dev["q_idx"], dev["k_idx_cache"], 8, impl="triton", check_lengths=False)
    assert unchecked.check_lengths is False
    with pytest.raises(ValueError, match="takes bfloat16 or float16 q_idx"):
        plan_indexer(dev["q_idx"].float(), dev["k_idx_cache"].float(), 8, impl="triton")
    with pytest.raises(ValueError, match="comes from the Triton kernel only"):
        plan_indexer(case["q_idx"], case["k_idx_cache"], 8, impl="torch", output="block_scores")


def _bad(case, **override):
    args = dict(q_idx=case["q_idx"], k_idx_cache=case["k_idx_cache"], page_table=case["page_table"],
                cu_seqlens_q=case["cu_seqlens_q"], seq_lens_kv=case["seq_lens_kv"], topk=8)
    args.update(override)
    return args


@pytest.mark.parametrize("field,make,match", [
    ("q_idx", lambda c: c["q_idx"].to(torch.int32), "q_idx must be one of"),
    ("k_idx_cache", lambda c: c["k_idx_cache"].half(), "k_idx_cache must be one of"),
    ("q_idx", lambda c: c["q_idx"][:, :, None], "q_idx must have 3 dims"),
    ("k_idx_cache", lambda c: c["k_idx_cache"].transpose(1, 2).contiguous().transpose(1, 2), "unit stride"),
    ("page_table", lambda c: c["page_table"].long(), "page_table must be one of"),
    ("seq_lens_kv", lambda c: c["seq_lens_kv"].to("meta"), "is on meta"),
    ("topk", lambda c: 5, "topk must be one of"),
    ("seq_lens_kv", lambda c: c["seq_lens_kv"] - 200, "q_len <= seq_lens_kv"),
    ("cu_seqlens_q", lambda c: c["cu_seqlens_q"][:-1], "cu_seqlens_q must have"),
])
def test_indexer_rejects_bad_input(paged_case, field, make, match):
    case = paged_case([10, 20], [100, 200], hkv=2, d_idx=64, block=64)
    with pytest.raises(ValueError, match=match):
        msa_indexer(**_bad(case, **{field: make(case)}), impl="torch")


def test_indexer_triton_on_cpu_needs_interpreter(paged_case, monkeypatch):
    case = paged_case([10], [100], hkv=2, d_idx=64, block=64)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        msa_indexer(**_bad(case), impl="triton")
    assert msa_indexer(**_bad(case), impl="auto").shape == (10, 2, 8)  # auto on CPU = torch reference


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("h,d_idx,block,topk", [(4, 128, 128, 16), (3, 64, 64, 32), (1, 128, 64, 4)])
def test_indexer_kernel_gpu_large(paged_case, h, d_idx, block, topk):
    case = paged_case([3000, 1, 5000], [7000, 4096, 9001], hkv=h, d_idx=d_idx, block=block, device="cuda",
                      seed=h)
    args = _args(case)
    ids, lse = msa_indexer(*args, topk, return_lse=True)
    ref_ids, ref_lse = naive.indexer_paged_reference(*args, topk, return_lse=True)
    assert_close("ids", ref_ids, ids, scores=naive.paged_block_scores(*args))
    same = (ids == ref_ids).all(-1)
    assert_close("lse", ref_lse[same], lse[same], 1e-3, atol=2e-3)
