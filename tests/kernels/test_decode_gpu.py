"""GPU checks of the decode kernels at M3 sizes, and the CUDA-graph capture/replay contract."""
from dataclasses import replace

import pytest
import torch

from kernels.decode import (
    DecodeTuning,
    DenseDecodePlan,
    MSADecodePlan,
    decode_indexer_ref,
    dense_decode_attention_ref,
    dequantized_index_queries,
    dequantized_int8_queries,
    quantize_index_keys,
    quantize_int8_rows,
    sparse_decode_attention_ref,
)
from kernels.indexer.naive import paged_block_scores
from kernels.testing import assert_close, decode_case, make_page_table

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

HQ, HKV, D, PAGE, TOPK, D_IDX = 64, 4, 128, 128, 16, 128
SEQ_LENS = [16, 127, 128, 129, 2000, 20000, 24001, 9000]  # short and long requests mixed


def assert_ids_close(ref, ids, case, keys=None, scale=None):
    """Exact structure; history sets equal, or differing only on near-ties of the fp32 page scores."""
    keys = case.k_idx_cache if keys is None else keys
    if scale is not None:
        keys = keys.float() * scale[..., None]
    scores = paged_block_scores(case.q_idx.float(), keys.float(), case.page_table, case.cu_seqlens_q, case.seq_lens)
    assert_close("ids", ref, ids, scores=scores, max_differ=0.01)


def gpu_case(q_len, seed, seq_lens=SEQ_LENS, poison=True, **kw):
    return decode_case(seq_lens, q_len, hkv=HKV, group=HQ // HKV, d=D, block=PAGE, d_idx=D_IDX, device="cuda",
                       seed=seed, poison=poison, **kw)


def msa_plan(**kw):
    return MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", **kw)


@pytest.mark.parametrize("q_len", [1, 8])
def test_msa_step_matches_reference_at_m3_sizes(q_len):
    case = gpu_case(q_len, seed=q_len)
    plan = msa_plan(return_lse=True)
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.out.fill_(float("nan"))
    plan.topk_ids.fill_(-7)
    out = plan.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
    ref_ids = decode_indexer_ref(case.q_idx, case.k_idx_cache, case.page_table, case.seq_lens, q_len, TOPK)
    assert_ids_close(ref_ids, plan.topk_ids, case)
    ref, ref_lse = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, plan.topk_ids, case.page_table,
                                               case.seq_lens, q_len)
    assert_close("out", ref, out)
    assert_close("lse", ref_lse, plan.lse, 1e-3, atol=1e-3)


@pytest.mark.parametrize("q_len", [1, 8])
def test_dense_matches_reference_at_m3_sizes(q_len):
    case = gpu_case(q_len, seed=10 + q_len)
    plan = DenseDecodePlan(HQ, HKV, D, PAGE, device="cuda", return_lse=True)
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.out.fill_(float("nan"))
    out = plan.run(case.q, case.k_cache, case.v_cache)
    ref, ref_lse = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.page_table, case.seq_lens,
                                              q_len)
    assert_close("out", ref, out)
    assert_close("lse", ref_lse, plan.lse, 1e-3, atol=1e-3)


def test_fp8_index_keys_match_reference_on_the_same_quantized_keys():
    case = gpu_case(8, seed=20)
    k8, scale = quantize_index_keys(case.k_idx_cache)
    plan = msa_plan(index_dtype=torch.float8_e4m3fn, index_fp8_dot=False)
    plan.plan(case.seq_lens, case.page_table, 8)
    ids = plan.run_indexer(case.q_idx, k8, scale)
    ref = decode_indexer_ref(case.q_idx, k8, case.page_table, case.seq_lens, 8, TOPK, k_idx_scale=scale)
    assert_ids_close(ref, ids, case, keys=k8, scale=scale)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("ppi,warps", [(1, 4), (2, 4), (4, 4), (4, 8)])
def test_indexer_launch_variants_match_reference(fp8, ppi, warps):
    """Pages-per-iteration / warps variants give the reference's pages (fp8 keys on the fp16-convert
    path, which scores with the unquantised queries)."""
    case = gpu_case(8, seed=40 + ppi)
    keys, scale = quantize_index_keys(case.k_idx_cache) if fp8 else (case.k_idx_cache, None)
    plan = msa_plan(index_dtype=keys.dtype, index_fp8_dot=False,
                    tuning=DecodeTuning(pages_per_iter=ppi, index_warps=warps))
    plan.plan(case.seq_lens, case.page_table, 8)
    plan.topk_ids.fill_(-7)
    ids = plan.run_indexer(case.q_idx, keys, scale)
    ref = decode_indexer_ref(case.q_idx, keys, case.page_table, case.seq_lens, 8, TOPK, k_idx_scale=scale)
    assert_ids_close(ref, ids, case, keys=keys, scale=scale)


@pytest.mark.parametrize("q_len,ppi,warps", [(1, None, None), (8, None, None), (1, 4, 4), (1, 4, 8)])
def test_fp8_dot_indexer_matches_reference_with_quantized_queries(q_len, ppi, warps):
    """fp8 keys default to the fp8 x fp8 dot (queries rounded to e4m3 per row): the reference scores
    with the same dequantised queries."""
    case = gpu_case(q_len, seed=50 + q_len)
    k8, scale = quantize_index_keys(case.k_idx_cache)
    plan = msa_plan(index_dtype=torch.float8_e4m3fn, tuning=DecodeTuning(pages_per_iter=ppi, index_warps=warps))
    assert plan.fp8_dot
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.topk_ids.fill_(-7)
    ids = plan.run_indexer(case.q_idx, k8, scale)
    q_deq = dequantized_index_queries(case.q_idx)
    ref = decode_indexer_ref(q_deq, k8, case.page_table, case.seq_lens, q_len, TOPK, k_idx_scale=scale)
    assert_ids_close(ref, ids, replace(case, q_idx=q_deq), keys=k8, scale=scale)


@pytest.mark.parametrize("q_len,ppi", [(1, None), (8, None), (1, 2)])
def test_int8_index_keys_match_reference_with_int8_queries(q_len, ppi):
    """int8 keys: the int8 x int8 tensor-core dot with queries rounded to int8 per row; the reference scores
    the same rounded queries."""
    case = gpu_case(q_len, seed=70 + q_len)
    k8, scale = quantize_int8_rows(case.k_idx_cache)
    plan = msa_plan(index_dtype=torch.int8, tuning=DecodeTuning(pages_per_iter=ppi))
    plan.plan(case.seq_lens, case.page_table, q_len)
    plan.topk_ids.fill_(-7)
    ids = plan.run_indexer(case.q_idx, k8, scale)
    q_deq = dequantized_int8_queries(case.q_idx)
    ref = decode_indexer_ref(case.q_idx, k8, case.page_table, case.seq_lens, q_len, TOPK, k_idx_scale=scale)
    assert_ids_close(ref, ids, replace(case, q_idx=q_deq), keys=k8, scale=scale)


@pytest.mark.parametrize("splits,stages", [(1, 2), (1, 3), (2, 3), (4, 3)])
def test_sparse_attention_split_and_stage_variants(splits, stages):
    case = gpu_case(1, seed=60 + stages)
    plan = msa_plan(return_lse=True, tuning=DecodeTuning(attn_splits=splits, attn_stages=stages))
    plan.plan(case.seq_lens, case.page_table, 1)
    plan.run_indexer(case.q_idx, case.k_idx_cache)
    plan.out.fill_(float("nan"))
    out = plan.run_attention(case.q, case.k_cache, case.v_cache)
    ref, ref_lse = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, plan.topk_ids, case.page_table,
                                               case.seq_lens, 1)
    assert_close("out", ref, out)
    assert_close("lse", ref_lse, plan.lse, 1e-3, atol=1e-3)


@pytest.mark.parametrize("q_len", [1, 8])
def test_cuda_graph_capture_once_replay_with_changed_metadata(q_len):
    lens_a = [300, 40000, 129, 7000]
    lens_b = [45000, 200, 8000, 5000]
    max_pages = 400
    # no poison here: the second page table reuses pages freely
    case = gpu_case(q_len, seed=30 + q_len, seq_lens=lens_a, poison=False, max_pages=max_pages)
    table_a = case.page_table.cpu()
    table_b = make_page_table(4, max_pages, case.k_cache.shape[0], torch.Generator().manual_seed(3))
    seq_a = torch.tensor(lens_a, dtype=torch.int32)
    seq_b = torch.tensor(lens_b, dtype=torch.int32)

    msa = msa_plan()
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
        eager_msa = msa_plan()
        eager_msa.plan(seq, table, q_len)
        want = eager_msa.run(case.q, case.q_idx, case.k_cache, case.v_cache, case.k_idx_cache)
        assert torch.equal(msa.topk_ids, eager_msa.topk_ids)
        assert torch.equal(msa.out, want)
        want_dense, _ = dense_decode_attention_ref(case.q, case.k_cache, case.v_cache, table.cuda(), seq.cuda(), q_len)
        assert_close("dense out", want_dense, dense.out)
