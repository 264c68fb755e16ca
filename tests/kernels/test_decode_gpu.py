"""GPU checks of the decode kernels at M3 sizes, and the CUDA-graph capture/replay contract."""
import pytest
import torch

from kernels.decode import (
    DenseDecodePlan,
    MSADecodePlan,
    decode_indexer_ref,
    dense_decode_attention_ref,
    quantize_index_keys,
    sparse_decode_attention_ref,
)
from kernels.decode.inputs import make_decode_case, make_page_table

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HQ, HKV, D, PAGE, TOPK, D_IDX = 64, 4, 128, 128, 16, 128
SEQ_LENS = [16, 127, 128, 129, 2000, 20000, 24001, 9000]  # short and long requests mixed


def page_scores(q_idx, k_idx_cache, page_table, r, t, own, scale=None):
    keys = k_idx_cache[page_table[r, :own].long()].float()
    if scale is not None:
        keys = keys * scale[page_table[r, :own].long()][..., None]
    return torch.einsum("hd,pbd->hpb", q_idx[t].float(), keys).amax(-1)  # [H, own]


def assert_selection_close(ids, ref, case, scale=None, keys=None):
    """Exact structure; non-local sets equal, or differing only on near-ties of the fp32 page scores."""
    keys = case.k_idx_cache if keys is None else keys
    assert torch.equal(ids[..., -1] == -1, ref[..., -1] == -1)
    diff = (ids.sort(-1).values != ref.sort(-1).values).any(-1)  # [T, H]
    for t, h in diff.nonzero().tolist():
        r = t // case.q_len
        own = (int(case.seq_lens[r]) - case.q_len + t % case.q_len) // PAGE
        scores = page_scores(case.q_idx, keys, case.page_table, r, t, own, scale)[h]
        kth = scores.sort(descending=True).values[TOPK - 2]
        chosen = scores[ids[t, h, : TOPK - 1].long()]
        assert chosen.min() >= kth - 1e-3 * scores.abs().max(), f"row {t},{h}: not a near-tie"
        assert ids[t, h, TOPK - 1] == own
    assert diff.float().mean().item() < 0.01


def gpu_case(q_len, seed, seq_lens=SEQ_LENS, spare_pages=2, poison=True):
    return make_decode_case(seq_lens, q_len, HQ, HKV, D, PAGE, D_IDX, device="cuda", seed=seed, poison=poison,
                            spare_pages=spare_pages)


@pytest.mark.parametrize("q_len", [1, 8])
def test_msa_step_matches_reference_at_m3_sizes(q_len):
    case = gpu_case(q_len, seed=q_len)
    plan = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", return_lse=True)
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.out.fill_(float("nan"))
    plan.topk_ids.fill_(-7)
    out = plan.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
    ref_ids = decode_indexer_ref(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, q_len, TOPK)
    assert_selection_close(plan.topk_ids, ref_ids, case)
    ref, ref_lse = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, plan.topk_ids, case.page_table,
                                               case.seq_lens, q_len)
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert (plan.lse - ref_lse).abs().max().item() < 1e-3


@pytest.mark.parametrize("q_len", [1, 8])
def test_dense_matches_reference_at_m3_sizes(q_len):
    case = gpu_case(q_len, seed=10 + q_len)
    plan = DenseDecodePlan(HQ, HKV, D, PAGE, device="cuda", return_lse=True)
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.out.fill_(float("nan"))
    out = plan.run(case.q, case.k_cache, case.v_cache)
    ref, ref_lse = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens,
                                              q_len)
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert (plan.lse - ref_lse).abs().max().item() < 1e-3


def test_fp8_index_keys_match_reference_on_the_same_quantized_keys():
    case = gpu_case(8, seed=20)
    k8, scale = quantize_index_keys(case.k_idx_cache)
    plan = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", index_fp8_dot=False)
    plan.plan(case.seq_lens, case.page_table, 8)
    ids = plan.run_indexer(case.q_idx, k8, scale)
    ref = decode_indexer_ref(case.q_idx, k8, case.page_table, case.seq_lens, 8, TOPK, k_idx_scale=scale)
    assert_selection_close(ids, ref, case, scale=scale, keys=k8)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("ppi,warps", [(1, 4), (2, 4), (4, 4), (4, 8)])
def test_indexer_launch_variants_match_reference(fp8, ppi, warps):
    """Every pages-per-iteration / warps variant the benchmark sweeps gives the reference's pages
    (fp8 keys on the fp16-convert path, which scores with the unquantised queries)."""
    case = gpu_case(8, seed=40 + ppi)
    keys, scale = quantize_index_keys(case.k_idx_cache) if fp8 else (case.k_idx_cache, None)
    plan = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", index_fp8_dot=False,
                         tuning=dict(pages_per_iter=ppi, num_warps=warps))
    plan.plan(case.seq_lens, case.page_table, 8)
    plan.topk_ids.fill_(-7)
    ids = plan.run_indexer(case.q_idx, keys, scale)
    ref = decode_indexer_ref(case.q_idx, keys, case.page_table, case.seq_lens, 8, TOPK, k_idx_scale=scale)
    assert_selection_close(ids, ref, case, scale=scale, keys=keys)


@pytest.mark.parametrize("q_len,tuning", [(1, None), (8, None), (1, dict(pages_per_iter=4, num_warps=4)),
                                           (1, dict(pages_per_iter=4, num_warps=8))])
def test_fp8_dot_indexer_matches_reference_with_quantized_queries(q_len, tuning):
    """fp8 keys default to the fp8 x fp8 dot (queries rounded to e4m3 per row): the reference scores
    with the same dequantised queries."""
    from dataclasses import replace

    from kernels.decode.fp8 import dequantized_index_queries
    case = gpu_case(q_len, seed=50 + q_len)
    k8, scale = quantize_index_keys(case.k_idx_cache)
    plan = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", tuning=tuning)
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.topk_ids.fill_(-7)
    ids = plan.run_indexer(case.q_idx, k8, scale)
    q_deq = dequantized_index_queries(case.q_idx)
    ref = decode_indexer_ref(q_deq, k8, case.page_table, case.seq_lens, q_len, TOPK, k_idx_scale=scale)
    assert_selection_close(ids, ref, replace(case, q_idx=q_deq), scale=scale, keys=k8)


@pytest.mark.parametrize("splits,stages", [(1, 2), (1, 3), (2, 3), (4, 3)])
def test_sparse_attention_split_and_stage_variants(splits, stages):
    case = gpu_case(1, seed=60 + stages)
    plan = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", return_lse=True,
                         num_splits=splits, tuning=dict(attn_num_stages=stages))
    plan.plan(case.seq_lens, case.page_table, 1)
    plan.run_indexer(case.q_idx, case.k_idx_cache)
    plan.out.fill_(float("nan"))
    out = plan.run_attention(case.q, case.k_cache, case.v_cache)
    ref, ref_lse = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, plan.topk_ids, case.page_table,
                                               case.seq_lens, 1)
    assert not torch.isnan(out).any()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert (plan.lse - ref_lse).abs().max().item() < 1e-3


@pytest.mark.parametrize("q_len", [1, 8])
def test_cuda_graph_capture_once_replay_with_changed_metadata(q_len):
    lens_a = [300, 40000, 129, 7000]
    lens_b = [45000, 200, 8000, 5000]
    max_pages = 400
    # no poison here: the second page table reuses pages freely
    case = gpu_case(q_len, seed=30 + q_len, seq_lens=lens_a, spare_pages=500, poison=False)
    table_a = torch.full((4, max_pages), 0, dtype=torch.int32)
    table_a[:, : case.page_table.shape[1]] = case.page_table.cpu()
    num_pages = case.k_cache.shape[0]
    table_b, _ = make_page_table(lens_b, PAGE, max_pages, num_pages, torch.Generator().manual_seed(3))
    seq_a = torch.tensor(lens_a, dtype=torch.int32)
    seq_b = torch.tensor(lens_b, dtype=torch.int32)

    msa = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda")
    dense = DenseDecodePlan(HQ, HKV, D, PAGE, device="cuda")
    for plan in (msa, dense):
        plan.plan(seq_a, table_a, q_len)

    def step():
        msa.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
        dense.run(case.q, case.k_cache, case.v_cache)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compiles outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    with pytest.raises(RuntimeError, match="outside CUDA graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            msa.plan(seq_b, table_b, q_len)

    for seq, table in ((seq_b, table_b), (seq_a, table_a)):
        for plan in (msa, dense):
            plan.plan(seq, table, q_len)  # same sizes: metadata copied in place
        msa.out.fill_(float("nan"))
        dense.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager_msa = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda")
        eager_msa.plan(seq, table, q_len)
        want = eager_msa.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
        assert torch.equal(msa.topk_ids, eager_msa.topk_ids)
        assert torch.equal(msa.out, want)
        want_dense, _ = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, table.cuda(), seq.cuda(), q_len)
        assert ((dense.out.float() - want_dense).norm() / want_dense.norm()).item() < 1e-2
