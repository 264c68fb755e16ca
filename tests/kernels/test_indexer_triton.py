"""The Triton indexer against the fp32 reference (interpreter on CPU, small sizes; larger on GPU)."""
import pytest
import torch

from kernels.indexer import msa_indexer, naive
from kernels.indexer.op import _launch_indexer, indexer_block_scores_triton

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def assert_selection_matches(ids, ref_ids, block_scores, tol=1e-3):
    """Exact structure (valid count, own block last, -1 padding); history sets equal, except where
    the differing blocks score within ``tol`` of the selection threshold (fp near-ties)."""
    assert ids.shape == ref_ids.shape and ids.dtype == torch.int32
    assert torch.equal(ids >= 0, ref_ids >= 0), "valid prefix lengths differ"
    assert torch.equal(ids == -1, ref_ids < 0), "padding must be exactly -1"
    n_valid = (ref_ids >= 0).sum(-1, keepdim=True)
    last = (n_valid - 1).clamp(min=0).long()
    assert torch.equal(ids.gather(-1, last), ref_ids.gather(-1, last)), "own block must be last"
    hist_ids = ids.sort(-1).values
    hist_ref = ref_ids.sort(-1).values
    differ = (hist_ids != hist_ref).any(-1)
    for t, h in differ.nonzero().tolist():
        got = set(ids[t, h].tolist()) - {-1}
        want = set(ref_ids[t, h].tolist()) - {-1}
        row = block_scores[t, h]
        threshold = min(row[b].item() for b in want if b != ref_ids[t, h, last[t, h, 0]].item())
        for b in got ^ want:
            assert abs(row[b].item() - threshold) <= tol, f"token {t} head {h}: block {b} is no near-tie"
    assert differ.float().mean() < 0.05


CASES = [  # q_lens, kv_lens (prefix = kv - q), H, d_idx, B, topk
    ([70, 5, 33], [262, 5, 400], 3, 64, 64, 4),
    ([130], [900], 4, 128, 128, 8),
    ([40, 1], [40, 300], 1, 64, 64, 16),
    ([17, 60], [1100, 700], 2, 64, 64, 32),
]


@pytest.mark.parametrize("q_lens,kv_lens,h,d_idx,block,topk", CASES)
def test_indexer_kernel_matches_reference(paged_case, q_lens, kv_lens, h, d_idx, block, topk):
    case = paged_case(q_lens, kv_lens, hkv=h, d_idx=d_idx, block=block, seed=topk, device=DEV)
    args = (case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    ids = msa_indexer(*args, topk, impl="triton")
    ref = naive.indexer_paged_reference(*args, topk)
    scores = naive.paged_block_scores(*args)
    assert_selection_matches(ids.cpu(), ref.cpu(), scores.cpu())


@pytest.mark.parametrize("q_lens,kv_lens,h,d_idx,block,topk", [CASES[0], CASES[3]])
def test_two_pages_per_iteration_gives_the_same_ids_and_scores(paged_case, q_lens, kv_lens, h, d_idx, block, topk):
    """Two key pages per loop iteration (two top-k tables merged at the end) == one page."""
    case = paged_case(q_lens, kv_lens, hkv=h, d_idx=d_idx, block=block, seed=topk + 1, device=DEV)
    args = (case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    one, two = (_launch_indexer(*args, topk, mode=0, pages_per_iter=p) for p in (1, 2))
    assert torch.equal(one, two)
    assert torch.equal(*(_launch_indexer(*args, topk, mode=1, pages_per_iter=p) for p in (1, 2)))
    case["q_idx"][: q_lens[0]].zero_()  # ties everywhere in request 0
    tied = _launch_indexer(*args, topk, mode=0, pages_per_iter=2)
    assert torch.equal(tied, _launch_indexer(*args, topk, mode=0, pages_per_iter=1))
    assert torch.equal(tied.cpu(), naive.indexer_paged_reference(*args, topk).cpu())


def test_indexer_ties_and_lse(paged_case):
    case = paged_case([9, 24], [9 + 18 * 64, 100], hkv=2, d_idx=64, block=64, device=DEV)
    case["q_idx"][:9].zero_()  # all-zero scores for request 0: ties everywhere
    args = (case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    ids, lse = msa_indexer(*args, 16, impl="triton", return_lse=True)
    assert ids[:9, :].tolist() == [[list(range(15)) + [18]] * 2] * 9
    ref_ids, ref_lse = naive.indexer_paged_reference(*args, 16, return_lse=True)
    assert torch.equal(ids.cpu(), ref_ids.cpu())
    assert not torch.isnan(lse).any()
    torch.testing.assert_close(lse.cpu(), ref_lse.cpu(), atol=2e-3, rtol=2e-3)


def test_block_score_mode_matches_reference(paged_case):
    case = paged_case([50, 3], [300, 130], hkv=3, d_idx=64, block=64, device=DEV)
    args = (case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    got = indexer_block_scores_triton(*args).cpu()
    ref = naive.paged_block_scores(*args).cpu()
    ref = torch.nn.functional.pad(ref, (0, got.shape[-1] - ref.shape[-1]), value=float("-inf"))
    local = torch.cat([(300 - 50 + torch.arange(50)) // 64, (130 - 3 + torch.arange(3)) // 64])
    history = (torch.arange(got.shape[-1])[None, :] < local[:, None])[:, None, :].expand_as(got)
    torch.testing.assert_close(got[history], ref[history], atol=1e-4, rtol=1e-4)  # history only
    assert torch.isinf(got[~history]).all()


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
@pytest.mark.parametrize("h,d_idx,block,topk,pages", [(4, 128, 128, 16, None), (3, 64, 64, 32, None),
                                                     (1, 128, 64, 4, None), (3, 64, 64, 16, 2), (4, 128, 128, 16, 2)])
def test_indexer_kernel_gpu_large(paged_case, h, d_idx, block, topk, pages):
    case = paged_case([3000, 1, 5000], [7000, 4096, 9001], hkv=h, d_idx=d_idx, block=block, device="cuda",
                      seed=h)
    args = (case["q_idx"], case["k_idx_cache"], case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    if pages is None:  # the op's defaults
        ids, lse = msa_indexer(*args, topk, return_lse=True)
    else:
        from kernels.indexer.op import _launch_selected_lse
        ids = _launch_indexer(*args, topk, mode=0, pages_per_iter=pages)
        lse = _launch_selected_lse(*args, ids)
    ref_ids, ref_lse = naive.indexer_paged_reference(*args, topk, return_lse=True)
    scores = naive.paged_block_scores(*args)
    assert_selection_matches(ids.cpu(), ref_ids.cpu(), scores.cpu())
    same = (ids == ref_ids).all(-1)
    torch.testing.assert_close(lse[same], ref_lse[same], atol=2e-3, rtol=2e-3)
