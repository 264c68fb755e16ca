"""CPU q4 mode pieces: the int8-ranked lm_head with exact top logits, bf16 K/V decode attention."""
import pytest
import torch
import torch.nn.functional as F

from engine.attention.dense import DenseAttention
from engine.cpu_decode import CpuDecodePlan
from engine.cpu_logits import EXACT_TOP, Int8Head, int8_gemm_available
from tests.engine.test_cpu_fast import decode_meta

needs_int8 = pytest.mark.skipif(not int8_gemm_available(), reason="torch's fbgemm int8 linear is missing here")


@pytest.fixture(autouse=True)
def one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def hidden_with_outliers(rows: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """LLM-like hidden states: a few channels 20x larger than the rest."""
    h = torch.randn(rows, k, generator=gen)
    h[:, [3, 17, 40]] *= 20
    return h


@needs_int8
def test_int8_head_gives_exact_top_logits():
    gen = torch.Generator().manual_seed(0)
    vocab, k = 3000, 64
    w = torch.randn(vocab, k, generator=gen) * 0.05
    h = hidden_with_outliers(16, k, gen)
    ref = F.linear(h, w)
    out = Int8Head(w)(h)
    assert out.dtype == torch.float32 and out.shape == (16, vocab)
    assert torch.equal(out.argmax(-1), ref.argmax(-1))
    top = ref.topk(8, dim=-1).indices  # the true best 8 sit inside the approximation's best EXACT_TOP
    torch.testing.assert_close(out.gather(1, top), ref.gather(1, top), rtol=1e-5, atol=1e-5)
    assert ((out - ref).norm() / ref.norm()).item() < 2e-2  # the int8 tail
    exact = (out - ref).abs() < 1e-5
    assert exact.sum(-1).min().item() >= EXACT_TOP  # each row: at least its recomputed candidates
    assert exact.float().mean().item() < 0.5  # ... and not the whole vocabulary (the rest is the int8 GEMM)


@needs_int8
def test_int8_head_rows_alone_match_batched_top():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2000, 96, generator=gen) * 0.05
    head = Int8Head(w)
    h = hidden_with_outliers(5, 96, gen)
    batched = head(h)
    for i in range(5):
        alone = head(h[i:i + 1])[0]
        top = batched[i].topk(4).indices
        torch.testing.assert_close(alone[top], batched[i][top], rtol=1e-5, atol=1e-5)
    assert head(h[:0]).shape == (0, 2000)


@pytest.mark.parametrize("page,lens", [(64, [1, 63, 64, 65, 130]), (128, [129, 160, 200, 256])])
def test_bf16_decode_plan_is_close_to_fp32_sdpa(page, lens):
    gen = torch.Generator().manual_seed(len(lens))
    hkv, g, d, num_pages = 3, 3, 64, 24
    kc = torch.randn(num_pages, hkv, page, d, generator=gen)
    vc = torch.randn(num_pages, hkv, page, d, generator=gen)
    q = torch.randn(len(lens), hkv * g, d, generator=gen)
    meta = decode_meta(lens, page, num_pages, gen)
    ref = DenseAttention(d ** -0.5)(0, q, kc, vc, meta)
    out = CpuDecodePlan.build(meta, hkv, page, d ** -0.5).run(q.bfloat16(), kc.bfloat16(), vc.bfloat16())
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    # the per-request prefill path takes the bf16 cache too (float32 queries are cast to it)
    pre = DenseAttention(d ** -0.5)(0, q, kc.bfloat16(), vc.bfloat16(), meta)
    assert ((pre.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_kv_cache_dtype_follows_weight_mode(default_llm):
    from engine import LLM

    assert default_llm.cache.k[0].dtype == torch.float32  # the exact default path keeps float32 K/V
    small = LLM("smollm2-135m", device="cpu", progress=False, weights="bf16", kv_cache_tokens=256)
    assert small.kv_dtype == torch.bfloat16 and small.cache.v[0].dtype == torch.bfloat16


def test_qk_norm_model_runs_in_bf16_mode_with_bf16_cache():
    """Qwen3-style q/k norms (the `qkv_proj` path: float32 q, bf16 cache) under bf16 weights stay close to fp32."""
    from types import SimpleNamespace

    from engine.config import ModelConfig
    from engine.cpu_weights import attach_cpu_weights
    from engine.kv_cache import CacheConfig, KVCache
    from engine.llm_engine import LLMEngine
    from engine.sampling import SamplingParams
    from engine.scheduler import SchedulerConfig
    from engine.testing import random_model
    from tests.engine.test_parity_hf import all_logits

    cfg = ModelConfig(arch="qwen3", vocab_size=96, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=96, max_position=256, qk_norm=True)
    runs = []
    for mode, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = random_model(cfg, "cpu", torch.float32, seed=3)
        attach_cpu_weights(model, mode)
        cache = KVCache(2, 2, 16, CacheConfig(page_size=16, num_pages=16, dtype=dtype), torch.device("cpu"))
        eng = LLMEngine(model, None, DenseAttention(16 ** -0.5), cache, SchedulerConfig(4, 64), 256,
                        torch.device("cpu"))
        llm = SimpleNamespace(engine=eng, model=model, cache=cache)
        ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(5)).tolist()
        logits = all_logits(llm, ids, chunk=8)
        for i in range(2):  # two requests through batched decode steps (the decode plan)
            eng.add_request(f"r{i}", ids[: 20 + i], SamplingParams(max_tokens=4, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
        runs.append((logits, [eng.pop_finished(f"r{i}").output_ids for i in range(2)]))
    (ref, ref_toks), (fast, fast_toks) = runs
    assert ((fast - ref).norm() / ref.norm()).item() < 3e-2
    assert all(len(t) == 4 and all(0 <= x < 96 for x in t) for t in fast_toks)
