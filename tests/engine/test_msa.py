"""MSA in the engine: covering top-k equals dense (greedy tokens), density and recall statistics,
the kernel path equals the reference path on a GPU."""
from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle. " * 10,
    [{"role": "user", "content": "Explain, step by step, how a bicycle gear system works. " * 12}],
    "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 12,
]


def untrained_adapter(llm_dense, out, **msa_kw):
    """An adapter with the backbone-derived starting projections (enough when every block is read)."""
    from engine.loader import load
    from engine.msa import IndexProjections, MSAConfig, base_fingerprint, save_adapter

    ld = load("smollm2-135m", progress=False)
    proj = IndexProjections(ld.config, MSAConfig(**msa_kw))
    proj.init_from_attention(ld.weights, ld.config)
    save_adapter(out, proj, {"model_id": "smollm2-135m", "fingerprint": base_fingerprint(ld.config, ld.weights)})
    return out


@pytest.fixture(scope="module")
def msa_b64(default_llm, tmp_path_factory):
    ad = untrained_adapter(default_llm, tmp_path_factory.mktemp("ad") / "b64", block_size=64, topk=8, d_idx=64)
    return LLM(f"smollm2-135m+{ad}", attention="msa", device="cpu", kv_cache_tokens=2048, progress=False)


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the fp32 references on a shared 2-core CPU (~8 CPU-min)
def test_covering_topk_gives_dense_greedy_tokens(default_llm, msa_b64):
    p = SamplingParams(max_tokens=64, ignore_eos=True)
    lens = [len(default_llm._to_ids(x)) for x in PROMPTS]
    assert all(2 * 64 < n and n + 64 <= 8 * 64 for n in lens), lens  # several blocks, all within top-8
    dense = default_llm.generate(PROMPTS, p)
    msa = msa_b64.generate(PROMPTS, p)
    assert [o.token_ids for o in msa] == [o.token_ids for o in dense]
    assert all(o.metrics["attention_density"] == pytest.approx(1.0) for o in msa)


def test_small_topk_density_formula_and_recall(msa_b64, tmp_path):
    ids = (msa_b64._to_ids(PROMPTS[0]) * 5)[:700]
    assert len(ids) == 700
    ad = msa_b64.msa_adapter.path
    ref = LLM(f"smollm2-135m+{ad}", attention="msa-ref", device="cpu", kv_cache_tokens=2048, progress=False,
              msa_overrides={"topk": 4, "track_recall": True})  # 4 of 11 blocks
    out = ref.generate([ids], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    B, k, n_layers, n_msa = 64, 4, 30, 28
    read = dense = 0
    for pos in list(range(700)) + [700]:  # the prompt, then one decode step
        read += n_msa * ((min(k, pos // B + 1) - 1) * B + pos % B + 1) + (n_layers - n_msa) * (pos + 1)
        dense += n_layers * (pos + 1)
    assert out.metrics["attention_density"] == pytest.approx(read / dense)
    rec = ref.engine.attention.recall_by_layer()
    assert sorted(rec) == list(range(2, 30))
    assert all(0.0 < r < 1.0 + 1e-5 for r in rec.values())
    assert min(rec.values()) < 0.999  # 4 of 11 blocks cannot hold all the mass everywhere


@pytest.mark.gpu
def test_gpu_kernels_match_reference_greedy_tokens():
    prompts = ["Write a long story about a lighthouse keeper who finds a message in a bottle. " * 160,
               [{"role": "user", "content": "Explain, step by step, how a bicycle gear system works. " * 200}],
               "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 240]
    p = SamplingParams(max_tokens=32, ignore_eos=True)
    got = {}
    for kind in ("msa", "msa-ref"):
        llm = LLM("smollm2-135m", attention=kind, device="cuda", dtype=torch.float16, kv_cache_tokens=16384,
                  progress=False)
        assert all(len(llm._to_ids(x)) > 16 * 128 for x in prompts)  # past the top-k: real selections
        got[kind] = [o.token_ids for o in llm.generate(prompts, p)]
        del llm
    assert got["msa"] == got["msa-ref"]


@pytest.mark.gpu
def test_gpu_msa_graphs_equal_eager_plans_and_follow_reference():
    """`--attention msa` on a GPU (the shipped adapter, whatever is committed), fp16, two requests of
    2200 and 2950 tokens (past top-k x B: real selections; chunked prefill mixes with decode steps).

    1. CUDA-graph replay of GraphMSAAttention's decode == the same plans launched eagerly (graphs off),
       token for token: max_model_len 3072 gives the graphs the page-table width (24 pages) that the
       eager plans have in every pure decode step, so both pick the same split counts.
    2. Against the torch references (msa-ref, teacher-forced on the generated tokens): every greedy
       token is msa-ref's argmax or within 0.2 nats of it (the decode kernels round differently: fp32
       split-K partials, the dense layers' paged kernel instead of SDPA), and >= 90% are its argmax."""
    from engine.gpu.msa_graph import GraphMSAAttention

    ref = LLM("smollm2-135m", attention="msa-ref", device="cuda", dtype=torch.float16, kv_cache_tokens=16384,
              max_model_len=3072, progress=False)
    story = ref._to_ids("Write a long story about a lighthouse keeper who finds a message in a bottle. " * 200)
    code = ref._to_ids("def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n" * 200)
    prompts = [story[:2200], code[:2950]]
    assert min(map(len, prompts)) > ref.msa.topk * ref.msa.block_size and ref.msa.block_size == 128
    p = SamplingParams(max_tokens=24, ignore_eos=True)
    got = {}
    for graphs in (True, False):
        llm = LLM("smollm2-135m", attention="msa", device="cuda", dtype=torch.float16, kv_cache_tokens=16384,
                  max_model_len=3072, cuda_graphs=graphs, progress=False)
        eng = llm.engine
        assert type(eng.attention) is GraphMSAAttention
        got[graphs] = [o.token_ids for o in llm.generate(prompts, p)]
        assert (eng.graph_runner is not None and bool(eng.graph_runner.graphs)) == graphs
        del llm, eng
    assert got[True] == got[False]
    gaps = []
    for prompt, toks in zip(prompts, got[True], strict=True):
        lps = ref.prompt_logprobs(prompt + toks, top_n=1)[len(prompt):]
        gaps += [max(top.values()) - lp for lp, top in lps]
    exact = sum(g == 0.0 for g in gaps)
    print(f"msa (graphs) vs msa-ref teacher-forced: {exact}/{len(gaps)} tokens are msa-ref's argmax, "
          f"largest gap {max(gaps):.4f} nats")
    assert max(gaps) < 0.2 and exact >= 0.9 * len(gaps), (exact, len(gaps), max(gaps))
