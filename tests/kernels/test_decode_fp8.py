"""FP8 (e4m3) K/V decode attention: the sparse and dense kernels (interpreter on CPU, and a GPU at M3 sizes)
against the references that dequantise exactly, the degenerate check, the distance to the bf16-cache result,
and the refusals of mixed or malformed inputs.

Bounds measured on these cases (relative RMS error of the bf16 output):
* widened K/V (the plans' default): 2.6-3.4e-3 against the dequantising reference, i.e. the rounding
  of the output to bf16; the LSE agrees to ~5e-8.
* e4m3 x e4m3 dots (``kv_fp8_dot=True``; q and p rounded to e4m3 in the kernel): 2.6-7.4e-2 against the
  reference (q's rounding alone: 1-2e-2), LSE 4-5e-3.
* the fp8 caches' result against the bf16 caches' (the quantisation of K and V itself): 2.7-3.4e-2.
"""
import pytest
import torch

from kernels._common.fp8 import FP8, quantize_rows
from kernels.decode import (
    DecodeTuning,
    DenseDecodePlan,
    MSADecodePlan,
    dense_decode_attention,
    dense_decode_attention_ref,
    msa_decode_attention,
    sparse_decode_attention_ref,
)
from kernels.testing import assert_close, decode_case, random_topk_ids

PAGE = 64
EXACT = 6e-3  # widened: bf16 output rounding
FP8_DOT = 0.1  # q and p rounded to e4m3 as well
VS_BF16 = 5e-2  # fp8 caches against the bf16 caches, widened

# (seq_lens, q_len, Hkv, G, d, k, splits): odd lengths, one shorter than a page, G = 1 / 3 / 16, MTP q_len
CASES = [
    ([1, 70, 640, 130], 1, 2, 1, 64, 4, 3),
    ([9, 200, 700], 3, 1, 3, 128, 5, 2),
    ([20, 390], 2, 1, 16, 64, 4, 1),
]


def fp8_caches(case):
    """(k8, k_scale, v8, v_scale) by the shared rule; NaN-poisoned tokens stay NaN (and their scales)."""
    k8, ks = quantize_rows(case.k_cache)
    v8, vs = quantize_rows(case.v_cache)
    return k8, ks, v8, vs


def make_case(seq_lens, q_len, hkv, group, d, seed, poison=True):
    return decode_case(seq_lens, q_len, hkv=hkv, group=group, d=d, block=PAGE, d_idx=16, seed=seed, poison=poison)


def fp8_plan(cls, case, splits, dot=None, **extra):
    hq, d = case.q.shape[1], case.q.shape[2]
    plan = cls(hq, case.k_cache.shape[1], d, PAGE, device="cpu", dtype=case.q.dtype, return_lse=True,
               impl="triton", tuning=DecodeTuning(attn_splits=splits), kv_dtype=FP8, kv_fp8_dot=dot, **extra)
    plan.plan(case.seq_lens, case.page_table, case.q_len)
    plan.out.fill_(float("nan"))
    plan.lse.fill_(float("nan"))
    return plan


def bounds(dot):
    return (FP8_DOT, 1.5e-2) if dot else (EXACT, 1e-5)


@pytest.mark.parametrize("dot", [False, True], ids=["widened", "fp8dot"])
@pytest.mark.parametrize("seq_lens,q_len,hkv,group,d,topk,splits", CASES)
def test_sparse_fp8_matches_dequantising_reference(seq_lens, q_len, hkv, group, d, topk, splits, dot):
    case = make_case(seq_lens, q_len, hkv, group, d, seed=q_len + d)
    k8, ks, v8, vs = fp8_caches(case)
    ids = random_topk_ids(seq_lens, q_len, PAGE, hkv, topk, seed=1, empty_rows=1)
    plan = fp8_plan(MSADecodePlan, case, splits, dot, topk=max(2, topk), index_dim=16)
    assert plan.attention_launch.kv_fp8 and plan.attention_launch.fp8_dot == dot
    out = plan.run_attention(case.q, k8, v8, topk_ids=ids, k_scale=ks, v_scale=vs)
    ref, ref_lse = sparse_decode_attention_ref(case.q, k8, v8, ids, case.page_table, case.seq_lens, q_len,
                                               k_scale=ks, v_scale=vs)
    out_tol, lse_tol = bounds(dot)
    assert out.dtype == case.q.dtype
    assert_close("out", ref, out, out_tol)
    assert_close("lse", ref_lse, plan.lse, lse_tol)
    # the first (token, head) row is all -1: zero output, -inf LSE
    assert (out[0, :group] == 0).all() and torch.isinf(plan.lse[0, :group]).all()


@pytest.mark.parametrize("dot", [False, True], ids=["widened", "fp8dot"])
@pytest.mark.parametrize("seq_lens,q_len,hkv,group,d,topk,splits", CASES)
def test_dense_fp8_matches_dequantising_reference(seq_lens, q_len, hkv, group, d, topk, splits, dot):
    case = make_case(seq_lens, q_len, hkv, group, d, seed=q_len + d + 1)
    k8, ks, v8, vs = fp8_caches(case)
    plan = fp8_plan(DenseDecodePlan, case, splits, dot)
    out = plan.run(case.q, k8, v8, k_scale=ks, v_scale=vs)
    ref, ref_lse = dense_decode_attention_ref(case.q, k8, v8, case.page_table, case.seq_lens, q_len,
                                              k_scale=ks, v_scale=vs)
    out_tol, lse_tol = bounds(dot)
    assert_close("out", ref, out, out_tol)
    assert_close("lse", ref_lse, plan.lse, lse_tol)


def test_topk_covering_all_pages_equals_dense_fp8():
    seq_lens, q_len, hkv, group, d = [8, 200, 450], 2, 2, 3, 64
    case = make_case(seq_lens, q_len, hkv, group, d, seed=21)
    k8, ks, v8, vs = fp8_caches(case)
    n_pages = max(-(-s // PAGE) for s in seq_lens)
    ids = torch.full((case.q.shape[0], hkv, n_pages + 1), -1, dtype=torch.int32)
    for t in range(case.q.shape[0]):  # every page up to the own one, own page last
        own = (int(case.seq_lens[t // q_len]) - q_len + t % q_len) // PAGE
        ids[t, :, : own + 1] = torch.tensor(list(range(own)) + [own], dtype=torch.int32)
    args = (case.page_table, case.seq_lens, q_len)
    sparse, sparse_lse = msa_decode_attention(case.q, k8, v8, ids, *args, return_lse=True, impl="triton",
                                              num_splits=2, k_scale=ks, v_scale=vs)
    dense, dense_lse = dense_decode_attention(case.q, k8, v8, *args, return_lse=True, impl="triton",
                                              num_splits=3, k_scale=ks, v_scale=vs)
    ref, ref_lse = dense_decode_attention_ref(case.q, k8, v8, *args, k_scale=ks, v_scale=vs)
    assert_close("sparse out", ref, sparse, EXACT)
    assert_close("dense out", ref, dense, EXACT)
    assert_close("sparse vs dense", dense.float(), sparse, EXACT)
    assert_close("sparse lse", ref_lse, sparse_lse, 1e-5)
    assert_close("dense lse", ref_lse, dense_lse, 1e-5)


@pytest.mark.parametrize("dot", [False, True], ids=["widened", "fp8dot"])
def test_fp8_result_close_to_bf16_cache_result(dot):
    seq_lens, q_len, hkv, group, d, topk = [9, 200, 700], 3, 1, 3, 128, 5
    case = make_case(seq_lens, q_len, hkv, group, d, seed=7, poison=False)
    k8, ks, v8, vs = fp8_caches(case)
    ids = random_topk_ids(seq_lens, q_len, PAGE, hkv, topk, seed=3)
    plan = fp8_plan(MSADecodePlan, case, 2, dot, topk=topk, index_dim=16)
    out = plan.run_attention(case.q, k8, v8, topk_ids=ids, k_scale=ks, v_scale=vs)
    bf16, _ = sparse_decode_attention_ref(case.q, case.k_cache, case.v_cache, ids, case.page_table, case.seq_lens,
                                          q_len)
    assert_close("fp8 vs bf16 caches", bf16, out, 2 * VS_BF16 if dot else VS_BF16)
    rel = ((out.double() - bf16.double()).norm() / bf16.double().norm()).item()
    assert rel > 1e-2, f"fp8 result is {rel:.1e} from the bf16 one: the caches were not read as fp8"


def test_torch_impl_on_cpu_dequantises():
    case = make_case([5, 150], 2, 2, 2, 64, seed=4, poison=False)
    k8, ks, v8, vs = fp8_caches(case)
    ids = random_topk_ids([5, 150], 2, PAGE, 2, 4, seed=2)
    args = (case.page_table, case.seq_lens, 2)
    out = msa_decode_attention(case.q, k8, v8, ids, *args, k_scale=ks, v_scale=vs)
    ref, _ = sparse_decode_attention_ref(case.q, k8, v8, ids, *args, k_scale=ks, v_scale=vs)
    assert out.dtype == case.q.dtype and torch.equal(out, ref.to(case.q.dtype))
    dense = dense_decode_attention(case.q, k8, v8, *args, k_scale=ks, v_scale=vs)
    dref, _ = dense_decode_attention_ref(case.q, k8, v8, *args, k_scale=ks, v_scale=vs)
    assert torch.equal(dense, dref.to(case.q.dtype))


def _bad(c, k8, ks, v8, vs, what):
    """Attention arguments with one thing wrong."""
    args = dict(k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs)
    bad = {
        "no scales": dict(k_scale=None, v_scale=None),
        "one scale": dict(v_scale=None),
        "scales with bf16": dict(k_cache=c.k_cache, v_cache=c.v_cache),
        "mixed caches": dict(v_cache=c.v_cache),
        "scale shape": dict(k_scale=ks[:, :, :-1]),
        "scale dtype": dict(v_scale=vs.half()),
        "scale strides": dict(k_scale=ks.transpose(1, 2).contiguous().transpose(1, 2)),
    }[what]
    args.update(bad)
    return args


REFUSALS = [
    ("no scales", "need k_scale and v_scale"),
    ("one scale", "need k_scale and v_scale"),
    ("scales with bf16", "go with float8_e4m3fn K/V caches only"),
    ("mixed caches", "both be float8_e4m3fn or both not"),
    ("scale shape", "k_scale must be fp32 \\[num_pages, Hkv, B\\]"),
    ("scale dtype", "v_scale must be fp32"),
    ("scale strides", "unit stride"),
]


@pytest.mark.parametrize("what,match", REFUSALS)
def test_bad_fp8_input_raises_one_line(what, match):
    case = make_case([5, 150], 2, 2, 2, 64, seed=4, poison=False)
    k8, ks, v8, vs = fp8_caches(case)
    ids = random_topk_ids([5, 150], 2, PAGE, 2, 4, seed=2)
    args = _bad(case, k8, ks, v8, vs, what)
    meta = (case.page_table, case.seq_lens, 2)
    for impl in ("torch", "triton"):
        with pytest.raises(ValueError, match=match) as err:
            msa_decode_attention(case.q, args["k_cache"], args["v_cache"], ids, *meta, impl=impl,
                                 k_scale=args["k_scale"], v_scale=args["v_scale"])
        assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match=match):
            dense_decode_attention(case.q, args["k_cache"], args["v_cache"], *meta, impl=impl,
                                   k_scale=args["k_scale"], v_scale=args["v_scale"])
    plan = DenseDecodePlan(4, 2, 64, PAGE, device="cpu", kv_dtype=FP8, impl="triton")
    plan.plan(case.seq_lens, case.page_table, 2)
    with pytest.raises(ValueError, match=match):
        plan.run(case.q, args["k_cache"], args["v_cache"], k_scale=args["k_scale"], v_scale=args["v_scale"])


def test_plan_refuses_caches_of_another_kv_dtype():
    case = make_case([5, 150], 2, 2, 2, 64, seed=4, poison=False)
    k8, ks, v8, vs = fp8_caches(case)
    bf16 = MSADecodePlan(4, 2, 64, PAGE, topk=4, index_dim=16, device="cpu")
    bf16.plan(case.seq_lens, case.page_table, 2)
    with pytest.raises(ValueError, match="built for torch.bfloat16 K/V"):
        bf16.run_attention(case.q, k8, v8, topk_ids=bf16.topk_ids, k_scale=ks, v_scale=vs)
    fp8 = DenseDecodePlan(4, 2, 64, PAGE, device="cpu", kv_dtype=FP8)
    fp8.plan(case.seq_lens, case.page_table, 2)
    with pytest.raises(ValueError, match="built for torch.float8_e4m3fn K/V"):
        fp8.run(case.q, case.k_cache, case.v_cache)
    with pytest.raises(ValueError, match="kv_dtype must be the queries' dtype"):
        DenseDecodePlan(4, 2, 64, PAGE, device="cpu", kv_dtype=torch.float16)
    with pytest.raises(ValueError, match="kv_fp8_dot=True needs kv_dtype"):
        DenseDecodePlan(4, 2, 64, PAGE, device="cpu", kv_fp8_dot=True)


def test_fp8_plan_refuses_gpus_without_fp8_tensor_cores(monkeypatch):
    """The plan's device check (no GPU needed: the capability is what the check reads)."""
    dev = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (8, 0))
    with pytest.raises(ValueError, match="compute capability >= 8.9.*this GPU is 8.0"):
        DenseDecodePlan(4, 2, 64, PAGE, device=dev, kv_dtype=FP8)
    with pytest.raises(ValueError, match="compute capability >= 8.9.*this GPU is 8.0"):
        MSADecodePlan(4, 2, 64, PAGE, topk=4, index_dim=16, device=dev, kv_dtype=FP8)
    DenseDecodePlan(4, 2, 64, PAGE, device=dev)  # bf16 K/V: no such requirement
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    assert DenseDecodePlan(4, 2, 64, PAGE, device=dev, kv_dtype=FP8).kv_fp8


def test_replan_keeps_the_fp8_launch_and_buffers():
    case = make_case([5, 150], 2, 2, 2, 64, seed=4, poison=False)
    plan = DenseDecodePlan(4, 2, 64, PAGE, device="cpu", kv_dtype=FP8, impl="triton")
    plan.plan(case.seq_lens, case.page_table, 2)
    launch, out = plan.attention_launch, plan.out
    assert launch.kv_fp8 and not launch.fp8_dot  # widened unless asked for the fp8 dots
    plan.plan(torch.tensor([7, 100], dtype=torch.int32), case.page_table, 2)
    assert plan.attention_launch is launch and plan.out is out


# -- GPU (H200 / any sm89+): M3 sizes, both fp8 paths, CUDA graphs -------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
HQ, HKV, D, GPU_PAGE, TOPK, D_IDX = 64, 4, 128, 128, 16, 128
GPU_SEQ_LENS = [16, 127, 129, 2000, 20000, 9001]


def gpu_case(q_len, seed, poison=True, **kw):
    return decode_case(GPU_SEQ_LENS, q_len, hkv=HKV, group=HQ // HKV, d=D, block=GPU_PAGE, d_idx=D_IDX,
                       device="cuda", seed=seed, poison=poison, **kw)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dot", [False, True], ids=["widened", "fp8dot"])
@pytest.mark.parametrize("q_len", [1, 8])
def test_gpu_fp8_msa_step_and_dense_match_reference(q_len, dot):
    case = gpu_case(q_len, seed=q_len + 2 * dot)
    k8, ks, v8, vs = fp8_caches(case)
    common = dict(device="cuda", return_lse=True, kv_dtype=FP8, kv_fp8_dot=dot)
    msa = MSADecodePlan(HQ, HKV, D, GPU_PAGE, topk=TOPK, index_dim=D_IDX, **common)
    dense = DenseDecodePlan(HQ, HKV, D, GPU_PAGE, **common)
    # fp8 dots: a little above the CPU cases' 7.4e-2 (no max-abs bound: q's rounding moves every score)
    out_tol, lse_tol, lse_atol = (0.12, 1.5e-2, None) if dot else (EXACT, 1e-4, 1e-2)
    for plan in (msa, dense):
        plan.plan(case.seq_lens, case.page_table, q_len)
        plan.out.fill_(float("nan"))
    out = msa.run(case.q, case.q_idx, k8, v8, case.k_idx_cache, k_scale=ks, v_scale=vs)
    ref, ref_lse = sparse_decode_attention_ref(case.q, k8, v8, msa.topk_ids, case.page_table, case.seq_lens,
                                               q_len, k_scale=ks, v_scale=vs)
    assert_close("sparse out", ref, out, out_tol)
    assert_close("sparse lse", ref_lse, msa.lse, lse_tol, atol=lse_atol)
    out = dense.run(case.q, k8, v8, k_scale=ks, v_scale=vs)
    ref, ref_lse = dense_decode_attention_ref(case.q, k8, v8, case.page_table, case.seq_lens, q_len,
                                              k_scale=ks, v_scale=vs)
    assert_close("dense out", ref, out, out_tol)
    assert_close("dense lse", ref_lse, dense.lse, lse_tol, atol=lse_atol)


@gpu
@pytest.mark.gpu
def test_gpu_fp8_cuda_graph_replays_with_changed_metadata():
    case = gpu_case(1, seed=5, poison=False, max_pages=200)
    k8, ks, v8, vs = fp8_caches(case)
    seq_a = case.seq_lens.cpu()
    seq_b = torch.tensor([20000, 300, 9000, 16, 129, 2000], dtype=torch.int32)
    table_a = case.page_table.cpu()
    table_b = table_a.flip(0).contiguous()  # other pages for every request (pages are distinct)
    msa = MSADecodePlan(HQ, HKV, D, GPU_PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", kv_dtype=FP8)
    dense = DenseDecodePlan(HQ, HKV, D, GPU_PAGE, device="cuda", kv_dtype=FP8)
    for plan in (msa, dense):
        plan.plan(seq_a, table_a, 1)

    def step():
        msa.run(case.q, case.q_idx, k8, v8, case.k_idx_cache, k_scale=ks, v_scale=vs)
        dense.run(case.q, k8, v8, k_scale=ks, v_scale=vs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seq, table in ((seq_b, table_b), (seq_a, table_a)):
        for plan in (msa, dense):
            plan.plan(seq, table, 1)
            plan.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        eager = MSADecodePlan(HQ, HKV, D, GPU_PAGE, topk=TOPK, index_dim=D_IDX, device="cuda", kv_dtype=FP8)
        eager.plan(seq, table, 1)
        want = eager.run(case.q, case.q_idx, k8, v8, case.k_idx_cache, k_scale=ks, v_scale=vs)
        assert torch.equal(msa.topk_ids, eager.topk_ids) and torch.equal(msa.out, want)
        ref, _ = dense_decode_attention_ref(case.q, k8, v8, table.cuda(), seq.cuda(), 1, k_scale=ks, v_scale=vs)
        assert_close("dense out", ref, dense.out, EXACT)


def test_benchmark_fp8ci_preset_reports_both_dtypes():
    """The benchmark's fp8 rows run end to end on the CPU (torch references; timings meaningless here)."""
    from benchmarks.kernels import decode as bench

    (row,) = bench.run("fp8ci")
    for name in ("step_bf16", "step_fp8kv_fp8idx", "sparse_fp8", "dense_fp8dot"):
        assert row[f"{name}_us"] > 0
    assert row["ratio_step_fp8kv_fp8idx"].endswith("x") and row["sparse_fp8_tb_s"] is not None
