"""FP8 (e4m3) K/V sparse prefill, Q8KV8: the Triton token and tile kernels (interpreter on the CPU, and a GPU
at a moderate M3-like size) against naive's model of their arithmetic (tight) and against the reference that
dequantises exactly (looser, measured), the degenerate check (every block selected = dense FP8 attention),
the plan's choice, the refusals of mixed or malformed inputs, and the benchmark's fp8ci preset.

Bounds measured on these cases (relative RMS error of the output; LSE in brackets), interpreter:
* kernels against the Q8KV8 model (both in the output dtype): fp16 3e-6 to 9e-6, bf16 about 4e-3 (the
  interpreter's fp32 -> bf16 store truncates, the reference rounds to nearest) [LSE 3e-8];
* against the exact dequantising reference (what q and p rounded to e4m3 add): 3.1-3.7e-2 [0.6-3.4e-3];
* the fp8 caches' exact reference against the bf16 caches' (the cache's own rounding): 2.9-3.9e-2, the
  kernels against the bf16 caches: 4.2-5.2e-2.
"""
import pytest
import torch

from kernels._common.device import DeviceInfo, device_info
from kernels._common.fp8 import FP8, dequantize_rows, quantize_rows
from kernels.indexer import naive as indexer_naive
from kernels.sparse_prefill import PrefillShape, TileConfig, msa_prefill_attention, plan_prefill
from kernels.sparse_prefill.naive import dense_causal_reference, sparse_attention_reference
from kernels.sparse_prefill.plan import fp8_prefill_uses_gluon
from kernels.testing import assert_close, paged_case

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"  # with CUDA every case runs on the GPU
# kernels against the Q8KV8 model (both in the output dtype); looser on a GPU: sm_90's e4m3 wgmma accumulates
# with reduced precision (Triton's default max_num_imprecise_acc there is 2**30: no promotion), so some
# probabilities round to the other e4m3 neighbour
MODEL = {torch.float16: 1.5e-2, torch.bfloat16: 1.5e-2} if CUDA else {torch.float16: 1e-4, torch.bfloat16: 8e-3}
LSE_MODEL = 1e-3 if CUDA else 1e-5
EXACT, LSE_EXACT = 5e-2, 5e-3  # kernels against the exact dequantising reference


def fp8_case(q_lens, kv_lens, *, hkv, group, d, block, topk, dtype=torch.bfloat16, seed=0, device=DEV):
    """A paged case with e4m3 caches + scales by the shared rule, and real (indexer) selections."""
    case = paged_case(q_lens, kv_lens, hkv=hkv, group=group, d=d, block=block, d_idx=32, dtype=dtype, seed=seed,
                      device=device).as_dict()
    ids = indexer_naive.indexer_paged_reference(case["q_idx"], case["k_idx_cache"], case["page_table"],
                                                case["cu_seqlens_q"], case["seq_lens_kv"], topk)
    k8, ks = quantize_rows(case["k_cache"])
    v8, vs = quantize_rows(case["v_cache"])
    return case, ids, dict(k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs)


def run_fp8(case, ids, fp8, **kw):
    """The op on the fp8 caches into NaN-poisoned outputs (every element must be written)."""
    q = case["q"]
    out, lse = torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"), device=q.device)
    return msa_prefill_attention(q, fp8["k_cache"], fp8["v_cache"], case["page_table"], case["cu_seqlens_q"],
                                 case["seq_lens_kv"], ids, impl="triton", out=out, lse=lse,
                                 k_scale=fp8["k_scale"], v_scale=fp8["v_scale"], **kw)


def references(case, ids, fp8, step=None):
    """(Q8KV8 model, exact dequantising reference), each (out fp32, lse)."""
    args = (case["q"], fp8["k_cache"], fp8["v_cache"], case["page_table"], case["cu_seqlens_q"],
            case["seq_lens_kv"], ids)
    scales = dict(k_scale=fp8["k_scale"], v_scale=fp8["v_scale"])
    return (sparse_attention_reference(*args, **scales, q8kv8=True, step=step),
            sparse_attention_reference(*args, **scales))


def model_step(case, ids, fp8, design):
    """Keys per v-scale group of the kernels the op runs: the tile plan's step, or the whole block."""
    if design == "token":
        return None
    shape = PrefillShape.of(case["q"], fp8["k_cache"], fp8["v_cache"], case["page_table"], ids)
    return plan_prefill(shape, device_info(case["q"].device), design="tile").block_n or None


# q_lens, kv_lens (chunks after a prefix, odd lengths, T < B), Hkv, G, d, B, topk, dtype
TILE_CASES = [
    ([45, 7, 33], [300, 7, 200], 2, 4, 64, 64, 4, torch.float16),
    ([20, 9], [20, 140], 1, 16, 128, 64, 8, torch.bfloat16),  # 128-row tiles: regrouped, token rare pass
    ([37], [421], 1, 8, 64, 128, 4, torch.float16),  # B 128 at 128 rows: 64-key steps
    ([30, 5], [500, 69], 2, 1, 64, 64, 16, torch.bfloat16),
    ([16], [333], 1, 2, 128, 64, 4, torch.bfloat16),
]
TOKEN_CASES = [
    ([9, 3], [200, 67], 1, 4, 64, 64, 4, torch.float16),
    ([6], [390], 1, 16, 128, 64, 8, torch.bfloat16),
]


@pytest.mark.parametrize("design,q_lens,kv_lens,hkv,group,d,block,topk,dtype",
                         [("tile", *c) for c in TILE_CASES] + [("token", *c) for c in TOKEN_CASES])
def test_kernel_matches_q8kv8_model_and_exact_reference(design, q_lens, kv_lens, hkv, group, d, block, topk, dtype):
    case, ids, fp8 = fp8_case(q_lens, kv_lens, hkv=hkv, group=group, d=d, block=block, topk=topk, dtype=dtype,
                              seed=group + d)
    out, lse = run_fp8(case, ids, fp8, design=design)
    assert out.dtype == dtype and lse.dtype == torch.float32
    (m_out, m_lse), (e_out, e_lse) = references(case, ids, fp8, model_step(case, ids, fp8, design))
    assert_close("out vs Q8KV8 model", m_out, out, MODEL[dtype])
    assert_close("lse vs Q8KV8 model", m_lse, lse, LSE_MODEL)
    assert_close("out vs exact", e_out, out, EXACT)
    assert_close("lse vs exact", e_lse, lse, LSE_EXACT)


def test_model_is_not_the_exact_reference_and_fp8_is_near_bf16():
    """The two references differ by q and p's e4m3 rounding (so 'tight' means something), and the fp8
    caches' result stays near the bf16 caches'."""
    case, ids, fp8 = fp8_case([40, 3], [300, 130], hkv=2, group=4, d=64, block=64, topk=4, dtype=torch.float16)
    (m_out, _), (e_out, _) = references(case, ids, fp8)
    rel = ((m_out - e_out).norm() / e_out.norm()).item()
    assert 1e-2 < rel < EXACT
    bf, _ = sparse_attention_reference(case["q"].float(), case["k_cache"].float(), case["v_cache"].float(),
                                       case["page_table"], case["cu_seqlens_q"], case["seq_lens_kv"], ids)
    assert_close("fp8 exact vs bf16 caches", bf, e_out, 4e-2)


def test_torch_path_dequantises_exactly():
    case, ids, fp8 = fp8_case([21, 4], [150, 70], hkv=2, group=3, d=64, block=64, topk=4, dtype=torch.float32)
    out, lse = msa_prefill_attention(case["q"], fp8["k_cache"], fp8["v_cache"], case["page_table"],
                                     case["cu_seqlens_q"], case["seq_lens_kv"], ids, impl="torch",
                                     k_scale=fp8["k_scale"], v_scale=fp8["v_scale"])
    kd, vd = dequantize_rows(fp8["k_cache"], fp8["k_scale"]), dequantize_rows(fp8["v_cache"], fp8["v_scale"])
    want, want_lse = sparse_attention_reference(case["q"], kd, vd, case["page_table"], case["cu_seqlens_q"],
                                                case["seq_lens_kv"], ids)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("design", ["tile", "token", "auto"])
def test_every_block_selected_equals_dense_fp8_attention(design):
    """topk covering every visible block: the kernel is dense causal FP8 attention over the dequantised K/V."""
    case, _, fp8 = fp8_case([13, 5], [250, 64], hkv=1, group=4, d=64, block=64, topk=8, dtype=torch.float16)
    ids = all_blocks([13, 5], [250, 64], 64, hkv=1, topk=8)
    out, _ = run_fp8(case, ids, fp8, design=design)
    dense = dense_causal_reference(case["q"].float(), fp8["k_cache"], fp8["v_cache"], case["page_table"],
                                   case["cu_seqlens_q"], case["seq_lens_kv"], k_scale=fp8["k_scale"],
                                   v_scale=fp8["v_scale"])
    assert_close("dense fp8", dense, out, EXACT)
    (m_out, _), _ = references(case, ids, fp8)
    assert_close("Q8KV8 model", m_out, out, MODEL[torch.float16])


def all_blocks(q_lens, kv_lens, block, hkv, topk):
    """Selections of every visible block, ascending (the own block last), -1 after: int32 ``[T, Hkv, topk]``."""
    rows = []
    for q_len, kv_len in zip(q_lens, kv_lens, strict=True):
        for pos in range(kv_len - q_len, kv_len):
            own = pos // block
            rows.append(list(range(own + 1)) + [-1] * (topk - own - 1))
    return torch.tensor(rows, dtype=torch.int32, device=DEV)[:, None].expand(-1, hkv, -1).contiguous()


def test_empty_selection_gives_zero_and_minus_inf():
    case, ids, fp8 = fp8_case([6], [200], hkv=2, group=2, d=64, block=64, topk=4, dtype=torch.float16)
    ids[2:4, 1] = -1
    out, lse = run_fp8(case, ids, fp8, design="tile")
    assert (out[2:4, 2:4] == 0).all() and (lse[2:4, 2:4] == float("-inf")).all()
    (m_out, m_lse), _ = references(case, ids, fp8)
    assert_close("out", m_out, out, MODEL[torch.float16])
    assert_close("lse", m_lse, lse, LSE_MODEL)


def _bad_input_case():
    case, ids, fp8 = fp8_case([5], [70], hkv=1, group=2, d=64, block=64, topk=4)
    return case, ids, fp8


@pytest.mark.parametrize("change,match", [
    (dict(k_scale=None, v_scale=None), "need k_scale and v_scale"),
    (dict(v_scale=None), "need k_scale and v_scale"),
    ("bf16 caches with scales", "go with float8_e4m3fn K/V caches only"),
    ("fp8 k, bf16 v", "share one dtype"),
    ("fp16 scale", r"k_scale must be fp32 \[num_pages, Hkv, B\]"),
    ("short scale", r"v_scale must be fp32 \[num_pages, Hkv, B\]"),
])
def test_refusals(change, match):
    case, ids, fp8 = _bad_input_case()
    if change == "bf16 caches with scales":
        fp8.update(k_cache=case["k_cache"], v_cache=case["v_cache"])
    elif change == "fp8 k, bf16 v":
        fp8.update(v_cache=case["v_cache"])
    elif change == "fp16 scale":
        fp8.update(k_scale=fp8["k_scale"].half())
    elif change == "short scale":
        fp8.update(v_scale=fp8["v_scale"][:, :, :32].contiguous())
    else:
        fp8.update(change)
    for impl in ("torch", "triton"):
        with pytest.raises(ValueError, match=match):
            msa_prefill_attention(case["q"], fp8["k_cache"], fp8["v_cache"], case["page_table"],
                                  case["cu_seqlens_q"], case["seq_lens_kv"], ids, impl=impl,
                                  k_scale=fp8["k_scale"], v_scale=fp8["v_scale"])


def test_q8kv8_model_needs_fp8_caches():
    case, ids, _ = _bad_input_case()
    with pytest.raises(ValueError, match="q8kv8=True models fp8 K/V"):
        sparse_attention_reference(case["q"], case["k_cache"], case["v_cache"], case["page_table"],
                                   case["cu_seqlens_q"], case["seq_lens_kv"], ids, q8kv8=True)


def test_plan_picks_the_fp8_kernel_in_one_place():
    """On an H200 (sm_90 with Gluon, 128-row tiles) bf16 takes Gluon; fp8 takes it only if
    ``fp8_prefill_uses_gluon()`` says so, or when asked for explicitly; elsewhere the Triton tile."""
    h200 = DeviceInfo(sm_major=9, sms=132, gluon=True)
    shape = PrefillShape(tokens=4096, requests=1, pages=64, q_heads=64, kv_heads=4, head_dim=128, block=128,
                         topk=16)
    fp8 = PrefillShape(**{**shape.__dict__, "kv_dtype": FP8})
    assert fp8.fp8 and not shape.fp8
    assert plan_prefill(shape, h200, design="tile").kernel == "gluon"
    want = "gluon" if fp8_prefill_uses_gluon() else "triton"
    plan = plan_prefill(fp8, h200, design="tile")
    assert plan.kernel == want and plan.rare_pass == ("items" if want == "gluon" else "token")
    assert plan_prefill(fp8, h200, design="tile", config=TileConfig(kernel="gluon")).kernel == "gluon"
    assert plan_prefill(fp8, DeviceInfo(sm_major=8, sms=108), design="tile").kernel == "triton"


def test_benchmark_fp8ci_preset():
    """The benchmark's fp8 table runs end to end in the interpreter (timings meaningless here); a forced
    kernel that cannot run here leaves its error in the row."""
    from benchmarks.kernels import prefill as bench

    rows = bench.run("fp8ci", ("triton", "gluon"))
    assert [r["case"] for r in rows] == ["tiny 64", "tiny 128"]
    for row in rows:
        assert row["bf16_attention_ms"] > 0 and row["q8kv8_attention_ms"] > 0 and row["dense_fp8_ms"] > 0
        assert row["ratio_bf16_over_q8kv8"].endswith("x") and row["speedup_q8kv8_vs_dense_fp8"].endswith("x")
        if not CUDA:
            assert row["q8kv8_kernels"].startswith("triton tile") and "needs a Hopper GPU" in row["q8kv8_gluon_error"]


def test_benchmark_dense_fp8_baseline_is_dense_attention():
    """The speed table's dense FP8 baseline (unions of every visible block) computes dense causal attention."""
    from benchmarks.kernels import prefill as bench

    s = bench.SHAPES["tiny"]
    x = bench.make_inputs(200, s, DEV)
    k8, ks = quantize_rows(x["k_cache"])
    v8, vs = quantize_rows(x["v_cache"])
    x8 = dict(x, k_cache=k8, v_cache=v8, k_scale=ks, v_scale=vs)
    plan = plan_prefill(PrefillShape.of(x["q"], k8, v8, x["page_table"], torch.empty(200, 1, 4)),
                        device_info(x["q"].device), design="tile", config=TileConfig(rare_max=0, group=False))
    tiles = bench.tile_table(x["cu_seqlens_q"], 200, plan.tile_q, longest_first=False)
    union = bench.dense_unions(200, s.block, plan.tile_q, s.hkv, x["page_table"], tiles)
    out, lse = torch.full_like(x["q"], float("nan")), torch.full((200, s.hq), float("nan"), device=DEV)
    bench.launch_tile(plan, x["q"], k8, v8, x["cu_seqlens_q"], x["seq_lens_kv"], tiles, union, out, lse,
                      s.d ** -0.5, ks, vs)
    dense = dense_causal_reference(x["q"].float(), k8, v8, x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"],
                                   k_scale=ks, v_scale=vs)
    assert_close("dense fp8 baseline", dense, out, EXACT)
    ids = all_blocks([200], [200], s.block, s.hkv, 4)
    (m_out, _), _ = references(dict(x, seq_lens_kv=x["seq_lens_kv"]), ids, x8)
    assert_close("dense fp8 baseline vs Q8KV8 model", m_out, out, MODEL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU with FP8 tensor cores (>= 8.9)")
@pytest.mark.parametrize("design", ["tile", "token"])
def test_gpu_plan_choice_matches_references(design):
    """M3's group (16 heads, d 128, B 128, top-16) at a moderate size: a 1500-token chunk after a 6K prefix
    and a short request, through the plan this GPU gets (the Hopper choice on an H200)."""
    case, ids, fp8 = fp8_case([1500, 77], [7700, 77], hkv=2, group=16, d=128, block=128, topk=16, device="cuda",
                              seed=3)
    shape = PrefillShape.of(case["q"], fp8["k_cache"], fp8["v_cache"], case["page_table"], ids)
    plan = plan_prefill(shape, device_info(case["q"].device), design=design)
    if design == "tile" and device_info(case["q"].device).gluon:
        assert plan.kernel == ("gluon" if fp8_prefill_uses_gluon() else "triton")
    out, lse = run_fp8(case, ids, fp8, design=design)
    (m_out, m_lse), (e_out, e_lse) = references(case, ids, fp8, plan.block_n or None)
    if plan.kernel != "gluon":  # the model's integer softmax reference is the Triton kernels' (gluon_tile_fp8: not)
        assert_close("out vs Q8KV8 model", m_out, out, MODEL[torch.bfloat16])
    assert_close("lse vs Q8KV8 model", m_lse, lse, LSE_MODEL)
    assert_close("out vs exact", e_out, out, EXACT)
    assert_close("lse vs exact", e_lse, lse, LSE_EXACT)
