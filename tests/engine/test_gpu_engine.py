"""GPU engine path (run on the device machine): fused ops in bf16 against the references, CUDA-graph
decode giving the same greedy tokens as eager decode (dense and MSA), GPU prefill (SDPA, chunked)
against the CPU logits."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.gpu import ops

pytestmark = pytest.mark.gpu

PROMPTS = ["Write a short poem about the sea.", "List three prime numbers. " * 12, "Hi"]


def test_fused_ops_bf16_match_reference():
    from engine.rope import RotaryEmbedding
    from engine.testing import shape_config

    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(37, 4096, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(4096, device="cuda", generator=g, dtype=torch.bfloat16)
    out, s = ops.rms_norm(x, w, 1e-5, residual=r)
    ref, s_ref = ops.rms_norm(x, w, 1e-5, residual=r, impl="torch")
    assert torch.equal(s, s_ref)
    assert (out.float() - ref.float()).abs().max() <= 2e-2 * ref.float().abs().max()
    gu = torch.randn(37, 2 * 14336, device="cuda", generator=g, dtype=torch.bfloat16)
    assert (ops.silu_mul(gu).float() - ops.silu_mul_ref(gu).float()).abs().max() < 3e-2
    hq, hkv, d, B = 32, 8, 128, 128
    qkv = torch.randn(37, (hq + 2 * hkv) * d, device="cuda", generator=g, dtype=torch.bfloat16)
    pos = torch.randint(0, 4000, (37,), device="cuda", generator=g)
    cos, sin = RotaryEmbedding(shape_config("llama-3.1-8b"), torch.device("cuda"))(pos)
    pages = torch.randperm(40, device="cuda", generator=g)[:37]
    res = []
    for impl in ("triton", "torch"):
        kc = torch.full((40, hkv, B, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        vc = kc.clone()
        res.append((ops.rope_cache(qkv, cos, sin, kc, vc, pages, pos % B, hq, hkv, impl=impl), kc, vc))
    for a, b in zip(*res, strict=True):
        assert torch.equal(a.isnan(), b.isnan())
        assert (a.float().nan_to_num(0) - b.float().nan_to_num(0)).abs().max() < 5e-2


@pytest.mark.parametrize("prompts,dtype,max_len", [(PROMPTS, "float32", None), (PROMPTS[:1], "bfloat16", 128)])
def test_graphs_on_equal_graphs_off_greedy(prompts, dtype, max_len):
    """float32 batch of 3 (padded to the captured size 4): rounding differences from other split
    counts stay far below any greedy margin. bf16 single request with a context of one page: the
    graph and eager plans have the same sizes, so the tokens must match bit for bit."""
    p = SamplingParams(max_tokens=24, ignore_eos=True)
    outs = []
    for graphs in (True, False):
        llm = LLM("smollm2-135m", device="cuda", dtype=dtype, kv_cache_tokens=32768, cuda_graphs=graphs,
                  max_model_len=max_len, progress=False)
        outs.append([o.token_ids for o in llm.generate(prompts, p)])
        assert (llm.engine.graph_runner is not None) == graphs
        if graphs:
            assert llm.engine.graph_runner.graphs, "no graph was captured"
        del llm
    assert outs[0] == outs[1]


def test_gpu_chunked_prefill_logits_match_cpu():
    ids = list(range(200, 200 + 300))
    cpu = LLM("smollm2-135m", device="cpu", progress=False, max_num_batched_tokens=128)
    gpu = LLM("smollm2-135m", device="cuda", dtype="float32", kv_cache_tokens=32768, max_num_batched_tokens=128,
              progress=False)
    a = [x[0] for x in cpu.prompt_logprobs(ids)[1:]]
    b = [x[0] for x in gpu.prompt_logprobs(ids)[1:]]
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-3


def test_msa_graph_decode_equals_eager_on_random_stack():
    """GraphMSAAttention: graph replay gives the eager plan path's greedy tokens and those of the plain
    MSAAttention decode with the Triton kernels (per-layer kernel calls, the path before the graphs were
    wired in), bf16, one request at a 3000-token context (past k blocks) with max_model_len = its page
    width (same plan sizes)."""
    from engine.attention import GpuDenseAttention, make_attention
    from engine.attention.msa import MSAAttention
    from engine.gpu.msa_graph import GraphMSAAttention
    from engine.testing import random_engine, random_indexer, random_model, shape_config

    cfg = shape_config("m3-attn", num_layers=2, hidden_size=512, intermediate_size=1024, vocab_size=1000,
                       max_position=8192)
    model = random_model(cfg, "cuda", dtype=torch.bfloat16, seed=3)
    prompt = torch.randint(100, 999, (3000,), generator=torch.Generator().manual_seed(0)).tolist()
    toks = []
    for eager, graphs in ((False, True), (False, False), (True, True)):
        torch.manual_seed(0)
        ix = random_indexer(cfg, "cuda")
        if eager:  # not capturable: the engine decodes it eagerly even with graphs asked for
            scale = cfg.head_dim ** -0.5
            attn = MSAAttention(ix.config, ix.projections, ix.rope, cfg.num_layers, scale, GpuDenseAttention(scale),
                                impl="triton")
        else:
            attn = make_attention("msa", "cuda", cfg, ix)
        assert type(attn) is (MSAAttention if eager else GraphMSAAttention)
        eng = random_engine(model, attn, "cuda", kv_cache_tokens=16384, max_num_seqs=4, max_model_len=3072,
                            cuda_graphs=graphs, index_dim=ix.config.d_idx, index_layers=ix.layers)
        got: dict[str, list[int]] = {}
        for o in eng.stream([("0", prompt, SamplingParams(max_tokens=24, ignore_eos=True))]):
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
        toks.append(got)
        assert (eng.graph_runner is not None and bool(eng.graph_runner.graphs)) == (not eager and graphs)
    assert toks[0] == toks[1] == toks[2]
