"""int8 index keys in the prefill indexer (the decode indexer's format, `kernels._common.int8`): the Triton
kernel (interpreter on CPU, small awkward shapes; larger on a GPU) against the dequantising fp32 reference,
the reference dequantising exactly, and bad input as one line."""
import pytest
import torch

from kernels._common.int8 import dequantize_int8_rows, dequantized_int8_queries, quantize_int8_rows
from kernels.indexer import launch, msa_indexer, naive, plan_indexer
from kernels.testing import assert_close

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"

CASES = [  # q_lens, kv_lens (prefix = kv - q), H, d_idx, B, topk
    ([70, 5, 33], [262, 5, 400], 3, 64, 64, 4),
    ([17, 60], [1100, 700], 2, 32, 64, 16),
    ([130], [530], 1, 128, 128, 8),
]


def _int8_case(paged_case, q_lens, kv_lens, **kw):
    case = paged_case(q_lens, kv_lens, device=DEV, **kw)
    k8, scale = quantize_int8_rows(case["k_idx_cache"])
    return case, (case["q_idx"], k8, case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"]), scale


@pytest.mark.parametrize("q_lens,kv_lens,h,d_idx,block,topk", CASES)
def test_int8_kernel_matches_dequantising_reference(paged_case, q_lens, kv_lens, h, d_idx, block, topk):
    _, args, scale = _int8_case(paged_case, q_lens, kv_lens, hkv=h, d_idx=d_idx, block=block, seed=topk)
    ids = msa_indexer(*args, topk, impl="triton", k_idx_scale=scale)
    ref = naive.indexer_paged_reference(*args, topk, k_idx_scale=scale)
    assert_close("ids", ref, ids, scores=naive.paged_block_scores(*args, k_idx_scale=scale))
    assert torch.equal(msa_indexer(*args, topk, impl="torch", k_idx_scale=scale).cpu(), ref.cpu())


def test_int8_block_scores_and_lse_match_reference(paged_case):
    """Tight: the kernel's block scores are those of the int8-rounded queries and the dequantised keys (an
    unrounded q, or a missing key or row scale, moves them far past 1e-5), and the selected LSE scores the same."""
    _, args, scale = _int8_case(paged_case, [20, 3], [300, 130], hkv=2, d_idx=64, block=64, seed=5)
    args[0].mul_(37.0)  # rows with amax >> 1: the per-row q scale matters
    plan = plan_indexer(args[0], args[1], 4, impl="triton", output="block_scores")
    assert plan.int8_keys and plan.scaled and not plan.fp8_keys
    got = launch(plan, *args, k_idx_scale=scale)
    ref = naive.paged_block_scores(*args, k_idx_scale=scale)
    ref = torch.nn.functional.pad(ref, (0, got.shape[-1] - ref.shape[-1]), value=float("-inf"))
    local = torch.cat([(300 - 20 + torch.arange(20)) // 64, (130 - 3 + torch.arange(3)) // 64])
    history = (torch.arange(got.shape[-1])[None, :] < local[:, None])[:, None, :].expand_as(got)
    assert_close("block scores", ref.cpu()[history], got.cpu()[history], 1e-5, atol=1e-3)
    unrounded = naive.paged_block_scores(args[0], dequantize_int8_rows(args[1], scale), *args[2:])
    unrounded = torch.nn.functional.pad(unrounded, (0, got.shape[-1] - unrounded.shape[-1]), value=float("-inf"))
    assert (unrounded.cpu()[history] - got.cpu()[history]).abs().max() > 1e-3  # the test sees the q rounding
    ids, lse = msa_indexer(*args, 4, impl="triton", return_lse=True, k_idx_scale=scale)
    ref_ids, ref_lse = naive.indexer_paged_reference(*args, 4, return_lse=True, k_idx_scale=scale)
    assert_close("ids", ref_ids, ids, scores=naive.paged_block_scores(*args, k_idx_scale=scale))
    assert_close("lse", ref_lse, lse, 1e-4, atol=1e-3)


def test_reference_dequantises_exactly(paged_case):
    """The int8 reference is the fp32 reference on ``k8 * scale`` and the int8-rounded q."""
    case = paged_case([40, 9], [700, 300], hkv=2, d_idx=64, block=64, seed=3)
    k8, scale = quantize_int8_rows(case["k_idx_cache"])
    rest = (case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"])
    got, got_lse = msa_indexer(case["q_idx"], k8, *rest, 8, impl="torch", return_lse=True, k_idx_scale=scale)
    want, want_lse = naive.indexer_paged_reference(dequantized_int8_queries(case["q_idx"]),
                                                   dequantize_int8_rows(k8, scale), *rest, 8, return_lse=True)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("override,match", [
    ({"k_idx_scale": None}, "int8 index keys need k_idx_scale"),
    ({"index_fp8_dot": True}, "index_fp8_dot=True scores against float8_e4m3fn"),
])
def test_int8_bad_input_is_one_line(paged_case, impl, override, match):
    case = paged_case([10], [200], hkv=2, d_idx=64, block=64, device=DEV)
    k8, scale = quantize_int8_rows(case["k_idx_cache"])
    args = dict(q_idx=case["q_idx"], k_idx_cache=k8, page_table=case["page_table"],
                cu_seqlens_q=case["cu_seqlens_q"], seq_lens_kv=case["seq_lens_kv"], topk=8, k_idx_scale=scale)
    with pytest.raises(ValueError, match=match) as err:
        msa_indexer(**{**args, **override}, impl=impl)
    assert "\n" not in str(err.value)


def test_launch_refuses_a_plan_for_other_keys(paged_case):
    case = paged_case([10], [200], hkv=2, d_idx=64, block=64, device=DEV)
    k8, scale = quantize_int8_rows(case["k_idx_cache"])
    bf16_plan = plan_indexer(case["q_idx"], case["k_idx_cache"], 8, impl="triton", output="block_scores")
    with pytest.raises(ValueError, match="made for bf16/fp16 index keys, got a int8 k_idx_cache: plan again"):
        launch(bf16_plan, case["q_idx"], k8, case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"],
               k_idx_scale=scale)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_int8_kernel_on_gpu_at_size(paged_case):
    """4 requests, up to 8K keys, d_idx 128, B 128, top-16: the int8 tensor-core dot against the reference; the
    ids of bf16 and int8 keys mostly agree."""
    case, args, scale = _int8_case(paged_case, [1024, 700, 1, 333], [8192, 700, 4000, 2600], hkv=3, d_idx=128,
                                   block=128, seed=11)
    ids = msa_indexer(*args, 16, k_idx_scale=scale)
    ref = naive.indexer_paged_reference(*args, 16, k_idx_scale=scale)
    assert_close("ids", ref, ids, scores=naive.paged_block_scores(*args, k_idx_scale=scale))
    bf16 = msa_indexer(case["q_idx"], case["k_idx_cache"], *args[2:], 16)
    same = (ids.long().sort(-1).values == bf16.long().sort(-1).values).all(-1).float().mean().item()
    assert same > 0.5, f"int8 and bf16 keys pick the same blocks on only {same:.1%} of rows"


def test_indexer_benchmark_times_int8_keys():
    """`python -m benchmarks.kernels.run --op indexer --preset int8` times bf16, int8 and fp8 keys; its `ci`
    preset runs the same code on tiny shapes (interpreter on a CPU)."""
    from benchmarks.kernels import indexer as bench

    assert bench.PRESETS["int8"].keys == ("bf16", "int8", "fp8")
    rows = bench.run("ci")
    assert [r["keys"] for r in rows] == ["bf16", "int8"] * 2
    assert all(r["indexer_ms"] > 0 and r["score_only_ms"] > 0 for r in rows)
    assert rows[0]["torch_topk_ms"] is not None and rows[1]["torch_topk_ms"] is None  # the topk baseline: bf16 only
