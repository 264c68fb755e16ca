"""The GPU hot path's pieces, checked on the CPU: fused Triton ops (interpreter) against their torch
references, the decode-plan hook against the SDPA path, batched sampling, closed-form MSA
statistics, graph batch padding, cache sizing and the random stacks."""
import os

import pytest
import torch

from engine.attention.dense import DenseAttention
from engine.attention.meta import DecodeShapes
from engine.gpu import ops
from engine.gpu.sampler import sample_batch
from engine.sampling import SamplingParams, sample
from engine.testing import random_engine, random_indexer, random_model, shape_config

needs_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@needs_interp
@pytest.mark.parametrize("n", [64, 96, 576])
def test_rms_norm_and_silu_triton_equal_reference(n):
    g = torch.Generator().manual_seed(n)
    x, r, w = (torch.randn(5, n, generator=g) for _ in range(2)), None, torch.randn(n, generator=g)
    x, r = x
    out, s = ops.rms_norm(x, w, 1e-5, residual=r, impl="triton")
    ref, s_ref = ops.rms_norm(x, w, 1e-5, residual=r, impl="torch")
    assert torch.equal(s, s_ref) and torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(ops.rms_norm(x, w, 1e-5, impl="triton"), ops.rms_norm_ref(x, w, 1e-5), atol=1e-5)
    gu = torch.randn(3, 2 * n, generator=g)
    assert torch.allclose(ops.silu_mul(gu, impl="triton"), ops.silu_mul_ref(gu), atol=1e-6)


@needs_interp
@pytest.mark.parametrize("hq,hkv,d", [(6, 2, 64), (4, 4, 32), (16, 1, 128)])
def test_rope_cache_triton_equals_reference(hq, hkv, d):
    from engine.rope import RotaryEmbedding

    g = torch.Generator().manual_seed(d)
    B, P, T = 16, 6, 7
    qkv = torch.randn(T, (hq + 2 * hkv) * d, generator=g)
    pos = torch.tensor([3, 17, 0, 5, 40, 41, 79])
    cos, sin = RotaryEmbedding(shape_config("m3-attn", head_dim=d), torch.device("cpu"))(pos)
    pages = torch.tensor([1, 4, 0, 2, 3, 3, 5])
    res = []
    for impl in ("triton", "torch"):
        kc = torch.full((P, hkv, B, d), float("nan"))
        vc = kc.clone()
        res.append((ops.rope_cache(qkv, cos, sin, kc, vc, pages, pos % B, hq, hkv, impl=impl), kc, vc))
    for a, b in zip(*res, strict=True):
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.allclose(a.nan_to_num(0), b.nan_to_num(0), atol=1e-5)
    assert not res[0][0].isnan().any()


@needs_interp
def test_select_ids_triton_equals_reference():
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 50000, (12,), generator=g)
    src = torch.tensor([3, -1, 0, 11, -1, 3, -1])
    host = torch.randint(0, 50000, (7,), generator=g)
    ref = ops.select_ids(src, host, tokens, impl="torch")
    assert ref.tolist() == [int(tokens[s]) if s >= 0 else int(h) for s, h in zip(src, host, strict=True)]
    assert torch.equal(ops.select_ids(src, host, tokens, impl="triton"), ref)
    with pytest.raises(ValueError, match="int64"):
        ops.select_ids(src.int(), host, tokens, impl="triton")


def test_auto_is_reference_on_cpu_and_triton_needs_interpreter(monkeypatch):
    x = torch.randn(2, 8)
    assert ops.resolve_impl("auto", x.device) == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        ops.resolve_impl("triton", x.device)
    with pytest.raises(ValueError, match="impl must be"):
        ops.resolve_impl("cuda", x.device)


def _tiny_engine(**kw):
    cfg = shape_config("llama-3.1-8b", vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, intermediate_size=96, max_position=512)
    model = random_model(cfg, "cpu", dtype=torch.float32, seed=1)
    return random_engine(model, DenseAttention(cfg.head_dim ** -0.5), "cpu", kv_cache_tokens=2048, page_size=16,
                         max_num_seqs=4, max_num_batched_tokens=40, **kw)


@pytest.mark.parametrize("gpu_class", [False, True])
def test_decode_plan_hook_matches_sdpa_path(gpu_class):
    """A decode batch through the decode-plan hook equals the per-request SDPA path: the CPU's batched
    CpuDecodePlan, and GpuDenseAttention's DenseDecodePlan (its torch reference here) with its SDPA prefill."""
    from engine.attention import GpuDenseAttention
    from engine.cpu_decode import CpuDecodePlan

    eng = _tiny_engine()
    p = SamplingParams(max_tokens=20, ignore_eos=True)
    for i, n in enumerate((37, 5, 64)):
        eng.add_request(f"r{i}", list(range(10 + i, 10 + i + n)), p)
    while any(s.num_computed < len(s.prompt_ids) for s in eng.scheduler.running + list(eng.scheduler.waiting)):
        eng.step()
    attn = GpuDenseAttention(16 ** -0.5, impl="torch") if gpu_class else eng.attention
    chunks = eng.scheduler.schedule()
    assert all(c.length == 1 for c in chunks) and len(chunks) == 3
    ids, pos, meta = eng._pack(chunks)
    h_sdpa = eng.model.hidden_states(ids, pos, meta, eng.cache, attn)
    attn.plan_decode(meta, eng.shapes, key="eager")
    assert meta.decode_plan is not None and isinstance(meta.decode_plan, CpuDecodePlan) != gpu_class
    h_plan = eng.model.hidden_states(ids, pos, meta, eng.cache, attn)
    assert torch.allclose(h_plan, h_sdpa, atol=1e-5, rtol=1e-4)


def test_random_engine_generates_and_prefill_chunks_agree():
    """Chunked prefill (40-token budget) and decode on a random stack: same tokens as one request alone."""
    p = SamplingParams(max_tokens=5, ignore_eos=True)
    prompts = [list(range(1, 90)), list(range(7, 20)), list(range(3, 60))]
    alone = []
    for pr in prompts:
        eng = _tiny_engine()
        eng.add_request("a", pr, p)
        toks = []
        while eng.has_unfinished():
            toks += [t for o in eng.step() for t in o.new_token_ids]
        alone.append(toks)
    eng = _tiny_engine()
    for i, pr in enumerate(prompts):
        eng.add_request(str(i), pr, p)
    got: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for o in eng.step():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert [got[str(i)] for i in range(3)] == alone and all(len(t) == 5 for t in alone)


def test_sample_batch_equals_per_row_sampling():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_k=5, seed=3), SamplingParams(),
              SamplingParams(temperature=1.0, top_p=0.5, seed=4)]
    gens = [None, torch.Generator().manual_seed(3), None, torch.Generator().manual_seed(4)]
    gens2 = [None, torch.Generator().manual_seed(3), None, torch.Generator().manual_seed(4)]
    got = sample_batch(logits, params, gens)
    assert got == [sample(logits[i], params[i], gens2[i]) for i in range(4)]
    with pytest.raises(ValueError, match="logit rows"):
        sample_batch(logits, params[:2], gens[:2])


def test_msa_keys_read_closed_form_matches_loop():
    from engine.gpu.msa_graph import keys_read_closed_form

    q_lens, kv_lens, B, k = [1, 300, 7, 1], [1, 300, 1000, 4097], 64, 4
    read, dense = keys_read_closed_form(q_lens, kv_lens, B, k)
    for ql, kl, r, d in zip(q_lens, kv_lens, read, dense, strict=True):
        pos = range(kl - ql, kl)
        assert r == sum((min(k, p // B + 1) - 1) * B + p % B + 1 for p in pos)
        assert d == sum(p + 1 for p in pos)


def test_graph_batch_padding_sizes():
    from engine.gpu.graph_runner import DecodeGraphRunner

    class Capturable:
        supports_cuda_graphs = True

        def plan_decode(self, *a, **k):
            pass

    shapes = DecodeShapes(4, 2, 16, 16, torch.float32, torch.device("cpu"))
    r = DecodeGraphRunner(None, None, Capturable(), shapes, max_batch=20, max_pages=8)
    assert r.batch_sizes == (1, 2, 4, 8, 12, 16, 20)
    assert [r.padded_size(n) for n in (1, 3, 9, 17, 20, 21)] == [1, 4, 12, 20, 20, None]
    assert r.can_run(5, 8) and not r.can_run(5, 9)
    with pytest.raises(ValueError, match="not CUDA-graph capturable"):
        DecodeGraphRunner(None, None, object(), shapes, max_batch=4, max_pages=8)


def test_cache_sizing_and_scratch_page():
    from engine.kv_cache import BlockManager, CacheConfig, KVCache, bytes_per_token, tokens_for_free_memory

    assert bytes_per_token(32, 8, 128, torch.bfloat16) == 2 * 32 * 8 * 128 * 2
    assert bytes_per_token(4, 4, 128, torch.bfloat16, 128, 4) == 2 * (2 * 4 * 4 * 128 + 4 * 128)
    with pytest.raises(ValueError, match="gpu_memory_fraction"):
        tokens_for_free_memory(1, torch.device("cpu"), fraction=1.5)
    c = KVCache(1, 2, 16, CacheConfig(page_size=16, num_pages=3), torch.device("cpu"), 8, (0,))
    assert c.k[0].shape[0] == 4 and c.k_idx[0].shape[0] == 4 and c.scratch_page == 3
    bm = BlockManager(3, 16)
    bm.grow("a", 40)
    assert bm.table_tensor("a").tolist() == bm.tables["a"] and 3 not in bm.tables["a"]


@pytest.mark.parametrize("dense_layers", [(), (0,)])
def test_msa_plan_hook_matches_engine_msa_decode(dense_layers):
    """GraphMSAAttention's plan path (what the graphs capture) equals MSAAttention's decode path,
    with every layer MSA and with a dense first layer (its DenseDecodePlan), as the shipped adapters have."""
    from engine.gpu.msa_graph import GraphMSAAttention

    cfg = shape_config("m3-attn", vocab_size=300, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=2,
                       head_dim=64, intermediate_size=96, max_position=4096)
    model = random_model(cfg, "cpu", dtype=torch.float32, seed=2)
    torch.manual_seed(0)
    ix = random_indexer(cfg, "cpu", torch.float32, topk=4, dense_layers=dense_layers)
    assert ix.layers == tuple(i for i in range(2) if i not in dense_layers)
    # on the CPU the plans run the kernels' torch references (impl "torch"); on a GPU make_attention builds it
    attn = GraphMSAAttention(ix.config, ix.projections, ix.rope, cfg.num_layers, cfg.head_dim ** -0.5,
                             DenseAttention(cfg.head_dim ** -0.5), impl="torch")
    eng = random_engine(model, attn, "cpu", kv_cache_tokens=4096, page_size=64, max_num_seqs=4,
                        max_num_batched_tokens=1024, index_dim=ix.config.d_idx, index_layers=ix.layers)
    p = SamplingParams(max_tokens=20, ignore_eos=True)
    for i, n in enumerate((700, 90, 400)):
        eng.add_request(f"r{i}", [(7 * j + i) % 290 + 1 for j in range(n)], p)
    while any(s.num_computed < len(s.prompt_ids) for s in eng.scheduler.running + list(eng.scheduler.waiting)):
        eng.step()
    chunks = eng.scheduler.schedule()
    ids, pos, meta = eng._pack(chunks)
    h_ref = eng.model.hidden_states(ids, pos, meta, eng.cache, eng.attention)
    read_ref = meta.stats["keys_read"]
    meta.stats = {}
    attn.plan_decode(meta, eng.shapes, key="eager")
    assert (meta.decode_plan.dense is not None) == bool(dense_layers)
    h_plan = eng.model.hidden_states(ids, pos, meta, eng.cache, eng.attention)
    assert torch.allclose(h_plan, h_ref, atol=1e-4, rtol=1e-4)
    assert meta.stats["keys_read"] == read_ref


def test_make_attention_decides_the_class_once_per_kind_and_device():
    """The table of engine.attention.factory: `--attention msa` on a GPU gets the capturable
    GraphMSAAttention (Triton), on the CPU the block-sparse CpuMaskedMSA (msa_cpu); msa-ref is the reference
    MSAAttention everywhere; msa-oracle the oracle selection over the device's attention; dense is
    GpuDenseAttention on a GPU. Building the objects launches nothing."""
    from engine.attention import ATTENTION_KINDS, GpuDenseAttention, make_attention
    from engine.attention.msa import CpuMaskedMSA, MSAAttention
    from engine.attention.oracle import GpuOracleMSA, OracleMSA
    from engine.errors import EngineError
    from engine.gpu.msa_graph import GraphMSAAttention

    cfg = shape_config("m3-attn", vocab_size=300, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=2,
                       head_dim=64, intermediate_size=96, max_position=4096)
    ix = random_indexer(cfg, "cpu", torch.float32, topk=4)
    got = {(k, d): make_attention(k, d, cfg, ix) for k in ATTENTION_KINDS for d in ("cpu", "cuda", "cuda:0")}
    assert ATTENTION_KINDS == ("dense", "msa", "msa-ref", "msa-oracle")
    assert type(got["dense", "cpu"]) is DenseAttention and type(got["dense", "cuda:0"]) is GpuDenseAttention
    assert type(got["msa", "cpu"]) is CpuMaskedMSA and type(got["msa", "cuda"]) is GraphMSAAttention
    assert type(got["msa-ref", "cpu"]) is type(got["msa-ref", "cuda"]) is MSAAttention
    assert type(got["msa-oracle", "cpu"]) is OracleMSA and type(got["msa-oracle", "cuda"]) is GpuOracleMSA
    assert got["msa-oracle", "cuda"].impl == "triton"
    assert got["msa", "cuda"].impl == "triton" and got["msa-ref", "cuda"].impl == "torch"
    assert type(got["msa", "cuda"].dense) is GpuDenseAttention and type(got["msa", "cpu"].dense) is DenseAttention
    graphs = {k: a.supports_cuda_graphs for k, a in got.items()}
    assert graphs == {k: k[1] != "cpu" and k[0] not in ("msa-ref", "msa-oracle") for k in got}
    with pytest.raises(EngineError, match="unknown attention 'msa-bogus': use one of dense, msa, msa-ref, msa-oracle"):
        make_attention("msa-bogus", "cpu", cfg, ix)
    with pytest.raises(ValueError, match="needs an MSA indexer"):
        make_attention("msa", "cpu", cfg)
    with pytest.raises(ValueError, match="use attention='msa-ref'"):
        make_attention("msa", "cpu", cfg, ix, track_recall=True)
    assert make_attention("msa-ref", "cpu", cfg, ix, track_recall=True).track_recall
