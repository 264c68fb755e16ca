"""MiniMax-M3 on a GPU (bf16, Triton MSA kernels, `kernels.moe` router + grouped GEMMs, CUDA graphs)
against transformers' own model in fp32 and against our torch references, on a tiny random checkpoint."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers.models.minimax_m3_vl")

from engine import LLM, SamplingParams
from engine.m3.testing import text_config, write_checkpoint
from engine.testing import all_logits

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("m3gpu")
    return d, write_checkpoint(d, text_config(num_layers=4, experts=8))


def _llm(path, attention: str, cuda_graphs: bool = True) -> LLM:
    return LLM(str(path), attention=attention, device="cuda", dtype="bfloat16", max_model_len=4096,
               kv_cache_tokens=16384, cuda_graphs=cuda_graphs, progress=False)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(10, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_bf16_logits_near_transformers_fp32(ckpt):
    path, ref = ckpt
    ids = _ids(1100, 0)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    llm = _llm(path, "msa")
    assert llm.model.layers[1].mlp.impl == "triton" and llm.engine.use_cuda_graphs
    got = all_logits(llm, ids).cpu()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel <= 3e-2, rel


def test_triton_msa_equals_torch_reference_on_gpu(ckpt):
    ids = _ids(1100, 1)
    a = all_logits(_llm(ckpt[0], "msa"), ids)
    b = all_logits(_llm(ckpt[0], "msa-ref"), ids)
    assert ((a - b).norm() / b.norm()).item() <= 2e-2


def test_cuda_graph_decode_equals_eager(ckpt):
    prompts = [_ids(n, 7 + n) for n in (300, 900)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    graphs = [o.token_ids for o in _llm(ckpt[0], "msa").generate(prompts, params)]
    eager = [o.token_ids for o in _llm(ckpt[0], "msa", cuda_graphs=False).generate(prompts, params)]
    assert graphs == eager
