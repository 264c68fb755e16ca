"""FP8 (e4m3) index keys in the prefill indexer: the Triton kernel (interpreter on CPU, small awkward shapes;
larger on a GPU) against the dequantising fp32 reference, with and without the e4m3 x e4m3 dot; the
reference dequantises exactly; bad input is one line."""
import pytest
import torch

from kernels._common.fp8 import dequantize_rows
from kernels._common.triton_fp8 import _round_e4m3_kernel
from kernels.decode import dequantized_index_queries, quantize_index_keys
from kernels.indexer import launch, msa_indexer, naive, plan_indexer
from kernels.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


Args = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # q_idx, k8, table, cu_q, lens


def _fp8_case(paged_case, q_lens, kv_lens, **kw) -> tuple[dict, Args, torch.Tensor]:
    case = paged_case(q_lens, kv_lens, device=DEV, **kw)
    k8, scale = quantize_index_keys(case["k_idx_cache"])
    args = (case["q_idx"], k8, case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    return case, args, scale


# Hopper's e4m3 tensor-core dot does not accumulate in full fp32 (DeepSeek-V3's report, section 3.3.2: about 14
# bits): block scores of the fp8 dot on an H200 are 6.8e-5 (relative RMS) from the exact ones, a selection
# 1.5e-3 from a 2.6 threshold; the interpreter and the widened path are exact to fp32
FP8_DOT_GPU = dict(ratio=2e-4, tie_tol=5e-3) if CUDA else dict(ratio=1e-5, tie_tol=1e-3)

CASES = [  # q_lens, kv_lens (prefix = kv - q), H, d_idx, B, topk
    ([70, 5, 33], [262, 5, 400], 3, 64, 64, 4),
    ([17, 60], [1100, 700], 2, 32, 64, 16),
    ([130], [530], 1, 128, 128, 8),
]


@pytest.mark.parametrize("fp8_dot", [False, True])
@pytest.mark.parametrize("q_lens,kv_lens,h,d_idx,block,topk", CASES)
def test_fp8_kernel_matches_dequantising_reference(paged_case, q_lens, kv_lens, h, d_idx, block, topk, fp8_dot):
    _, args, scale = _fp8_case(paged_case, q_lens, kv_lens, hkv=h, d_idx=d_idx, block=block, seed=topk + fp8_dot)
    ids = msa_indexer(*args, topk, impl="triton", k_idx_scale=scale, index_fp8_dot=fp8_dot)
    ref = naive.indexer_paged_reference(*args, topk, k_idx_scale=scale, fp8_dot=fp8_dot)
    assert_close("ids", ref, ids, scores=naive.paged_block_scores(*args, k_idx_scale=scale, fp8_dot=fp8_dot))
    torch_ids = msa_indexer(*args, topk, impl="torch", k_idx_scale=scale, index_fp8_dot=fp8_dot)
    assert torch.equal(torch_ids.cpu(), ref.cpu())


@pytest.mark.parametrize("fp8_dot", [False, True])
def test_fp8_block_scores_and_lse_match_reference(paged_case, fp8_dot):
    """Tight: the kernel's block scores are the dequantised ones (a wrong e4m3 rounding of q, or a missing
    key or row scale, moves them far past 1e-4), and the selected LSE scores the same keys."""
    _, args, scale = _fp8_case(paged_case, [20, 3], [300, 130], hkv=2, d_idx=64, block=64, seed=5)
    args[0].mul_(37.0)  # rows with amax >> 1: the per-row q scale matters
    plan = plan_indexer(args[0], args[1], 4, impl="triton", output="block_scores", index_fp8_dot=fp8_dot)
    got = launch(plan, *args, k_idx_scale=scale)
    ref = naive.paged_block_scores(*args, k_idx_scale=scale, fp8_dot=fp8_dot)
    ref = torch.nn.functional.pad(ref, (0, got.shape[-1] - ref.shape[-1]), value=float("-inf"))
    local = torch.cat([(300 - 20 + torch.arange(20)) // 64, (130 - 3 + torch.arange(3)) // 64])
    history = (torch.arange(got.shape[-1])[None, :] < local[:, None])[:, None, :].expand_as(got)
    tol = FP8_DOT_GPU if fp8_dot else dict(ratio=1e-5, tie_tol=1e-3)
    assert_close("block scores", ref.cpu()[history], got.cpu()[history], tol["ratio"],
                 atol=1e-3 if tol["ratio"] == 1e-5 else 5e-2)
    ids, lse = msa_indexer(*args, 4, impl="triton", return_lse=True, k_idx_scale=scale, index_fp8_dot=fp8_dot)
    ref_ids, ref_lse = naive.indexer_paged_reference(*args, 4, return_lse=True, k_idx_scale=scale, fp8_dot=fp8_dot)
    assert_close("ids", ref_ids, ids, scores=naive.paged_block_scores(*args, k_idx_scale=scale, fp8_dot=fp8_dot),
                 tie_tol=tol["tie_tol"])
    assert_close("lse", ref_lse, lse, 1e-4, atol=1e-3)


def test_reference_dequantises_exactly(paged_case):
    """The fp8 reference is the fp32 reference on ``k8 * scale`` (and, with fp8_dot, on the e4m3-rounded q)."""
    case = paged_case([40, 9], [700, 300], hkv=2, d_idx=64, block=64, seed=3)
    k8, scale = quantize_index_keys(case["k_idx_cache"])
    rest = (case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    q, deq = case["q_idx"].float(), dequantize_rows(k8, scale)
    for fp8_dot, q_eff in ((False, q), (True, dequantized_index_queries(case["q_idx"]))):
        got, got_lse = msa_indexer(case["q_idx"], k8, *rest, 8, impl="torch", return_lse=True, k_idx_scale=scale,
                                   index_fp8_dot=fp8_dot)
        want, want_lse = naive.indexer_paged_reference(q_eff, deq, *rest, 8, return_lse=True)
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    # and fp8 keys are not bf16 keys: the rounding moves the block scores
    bf16 = naive.paged_block_scores(case["q_idx"], case["k_idx_cache"], *rest)
    fp8 = naive.paged_block_scores(case["q_idx"], k8, *rest, k_idx_scale=scale)
    fin = torch.isfinite(bf16)
    assert not torch.equal(bf16[fin], fp8[fin])


def test_e4m3_rounding_of_the_interpreter_path():
    """The kernel's emulated e4m3 rounding (used under the interpreter, whose fp32 -> fp8 cast is wrong where
    rounding carries into the exponent) equals torch's cast, ties and subnormals included."""
    g = torch.Generator().manual_seed(0)
    mids = torch.cat([(torch.arange(8, 16).float() + 0.5) * 2.0 ** e for e in range(-9, 5)])  # exact ties
    x = torch.cat([torch.randn(4096, generator=g) * s for s in (100.0, 1.0, 1e-2, 1e-3)]
                  + [mids, -mids, torch.tensor([31.99, -127.9, 447.9, 448.0, 0.0, -0.0, 2.0 ** -10])])
    x = torch.nn.functional.pad(x, (0, 32768 - x.numel())).clamp(-448, 448)
    x = x.to(DEV)
    y = torch.empty_like(x)
    _round_e4m3_kernel[(1,)](x, y, N=x.numel())
    assert torch.equal(y, x.to(torch.float8_e4m3fn).float())


def _bad(case, k8, scale, **override):
    args = dict(q_idx=case["q_idx"], k_idx_cache=k8, page_table=case["page_table"],
                cu_seqlens_q=case["cu_seqlens_q"], seq_lens_kv=case["seq_lens_kv"], topk=8, k_idx_scale=scale)
    args.update(override)
    return args


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("make,match", [
    (lambda c, k8, s: {"k_idx_scale": None}, "float8_e4m3fn index keys need k_idx_scale"),
    (lambda c, k8, s: {"k_idx_cache": c["k_idx_cache"]}, "goes with a float8_e4m3fn or int8 k_idx_cache"),
    (lambda c, k8, s: {"k_idx_scale": s[:, :-1]}, r"k_idx_scale must be \[pages, B\]"),
    (lambda c, k8, s: {"k_idx_scale": s.bfloat16()}, "k_idx_scale must be one of"),
    (lambda c, k8, s: {"k_idx_scale": s[None]}, "k_idx_scale must have 2 dims"),
    (lambda c, k8, s: {"k_idx_cache": c["k_idx_cache"], "k_idx_scale": None, "index_fp8_dot": True},
     "index_fp8_dot=True scores against float8_e4m3fn"),
    (lambda c, k8, s: {"q_idx": k8[: c["q_idx"].shape[0]].view(c["q_idx"].shape[0], -1, k8.shape[-1])[:, :2]},
     "q_idx must be one of"),
])
def test_fp8_bad_input_is_one_line(paged_case, impl, make, match):
    case = paged_case([10], [200], hkv=2, d_idx=64, block=64, device=DEV)
    k8, scale = quantize_index_keys(case["k_idx_cache"])
    with pytest.raises(ValueError, match=match) as err:
        msa_indexer(**_bad(case, k8, scale, **make(case, k8, scale)), impl=impl)
    assert "\n" not in str(err.value)


def test_launch_refuses_a_plan_for_other_keys(paged_case):
    case = paged_case([10], [200], hkv=2, d_idx=64, block=64, device=DEV)
    k8, scale = quantize_index_keys(case["k_idx_cache"])
    args: Args = (case["q_idx"], k8, case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    bf16_plan = plan_indexer(case["q_idx"], case["k_idx_cache"], 8, impl="triton", output="block_scores")
    with pytest.raises(ValueError, match="plan again"):
        launch(bf16_plan, *args, k_idx_scale=scale)
    plan = plan_indexer(case["q_idx"], k8, 8, impl="triton", index_fp8_dot=True)
    assert (plan.fp8_keys, plan.fp8_dot) == (True, True)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU with FP8 (sm89+)")
@pytest.mark.parametrize("fp8_dot", [False, True])
def test_fp8_kernel_on_gpu_at_size(paged_case, fp8_dot):
    """4 requests, up to 8K keys, d_idx 128, B 128, top-16: the real e4m3 cast and (fp8_dot) the e4m3 tensor-core
    dot against the reference; the ids of bf16 and fp8 keys mostly agree."""
    q_lens, kv_lens = [1024, 700, 1, 333], [8192, 700, 4000, 2600]
    case, args, scale = _fp8_case(paged_case, q_lens, kv_lens, hkv=3, d_idx=128, block=128, seed=11)
    ids = msa_indexer(*args, 16, k_idx_scale=scale, index_fp8_dot=fp8_dot)
    ref = naive.indexer_paged_reference(*args, 16, k_idx_scale=scale, fp8_dot=fp8_dot)
    assert_close("ids", ref, ids, scores=naive.paged_block_scores(*args, k_idx_scale=scale, fp8_dot=fp8_dot),
                 tie_tol=FP8_DOT_GPU["tie_tol"] if fp8_dot else 1e-3)
    bf16 = msa_indexer(case["q_idx"], case["k_idx_cache"], *args[2:], 16)
    same = (ids.long().sort(-1).values == bf16.long().sort(-1).values).all(-1).float().mean().item()
    assert same > 0.5, f"fp8 and bf16 keys pick the same blocks on only {same:.1%} of rows"
