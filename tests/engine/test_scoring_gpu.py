"""The GPU path of issue 19's engine changes (defects 1 and 6), on a random fp32 stack: CUDA-graph decode
and one-step-late greedy decode running beside a scoring request (eager prefill chunks, never graph rows),
a request with generated-token log-probs, a tiny-temperature request and one with a faulty sampler; the
same tokens with graphs on and off, scores equal to a one-shot forward, the fault kept to its request."""
from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.attention import make_attention
from engine.scheduler import ScheduledChunk
from engine.sequence import Sequence
from engine.testing import random_engine, random_model, shape_config
from tests.engine.faults import faulty

pytestmark = pytest.mark.gpu
VOCAB = 1000


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model, graphs: bool):
    return random_engine(model, make_attention("dense", "cuda", model.cfg), "cuda", kv_cache_tokens=16384,
                         max_num_seqs=8, page_size=16, cuda_graphs=graphs)


def _run(eng, requests: dict) -> tuple[dict, dict, dict]:
    for rid, (ids, p) in requests.items():
        eng.add_request(rid, ids, p)
    toks, ends, rows = {r: [] for r in requests}, {}, {}
    while eng.has_unfinished():
        for o in eng.step():
            toks[o.request_id] += o.new_token_ids
            if o.prompt_logprobs is not None:
                rows[o.request_id] = o.prompt_logprobs
            if o.finished:
                ends[o.request_id] = (o.finish_reason, o.error)
                eng.pop_finished(o.request_id)
    return toks, ends, rows


@torch.inference_mode()
def _one_shot(eng, ids: list[int], top_n: int) -> list:
    seq = Sequence("probe", list(ids), SamplingParams(), max_len=len(ids))
    eng.blocks.grow("probe", len(ids))
    try:
        x, pos, meta = eng._pack([ScheduledChunk(seq, 0, len(ids))])
        lp = torch.log_softmax(eng.model.logits(eng.model.hidden_states(x, pos, meta, eng.cache, eng.attention)), -1)
    finally:
        eng.blocks.release("probe")
    v, i = torch.topk(lp[:-1], top_n, dim=-1)
    tok = lp[:-1].gather(1, torch.tensor(ids[1:], device=lp.device)[:, None])[:, 0]
    return [(None, {})] + [(float(t), dict(zip(a.tolist(), b.tolist(), strict=True)))
                           for t, a, b in zip(tok, i, v, strict=True)]


def test_graph_decode_beside_scoring_and_faults():
    cfg = shape_config("llama-3.1-8b", num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                       intermediate_size=512, vocab_size=VOCAB, max_position=4096)
    model = random_model(cfg, "cuda", dtype=torch.float32, seed=0)
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    good = {f"g{i}": (_prompt(20 + 7 * i, i), greedy) for i in range(3)}
    mix = dict(good, score=(_prompt(700, 9), SamplingParams(max_tokens=0, prompt_logprobs=3)),
               lp=(_prompt(30, 10), SamplingParams(max_tokens=12, ignore_eos=True, logprobs=2)),
               tiny=(good["g0"][0], SamplingParams(max_tokens=12, ignore_eos=True, temperature=1e-40)),
               bad=(_prompt(25, 11), faulty("top_k", max_tokens=12, temperature=0.8, seed=1)))
    results = {}
    for graphs in (True, False):
        eng = _engine(model, graphs)
        alone = {rid: _run(eng, {rid: req})[0][rid] for rid, req in good.items()}
        toks, ends, rows = _run(eng, mix)
        assert (eng.graph_runner is not None and bool(eng.graph_runner.graphs)) == graphs
        for rid in good:
            assert toks[rid] == alone[rid] and ends[rid] == ("length", None)
        assert toks["tiny"] == alone["g0"]
        assert ends["bad"][0] == "error" and "injected fault" in ends["bad"][1]
        assert ends["score"] == ("length", None) and toks["score"] == [] and len(rows["score"]) == 700
        want = _one_shot(eng, mix["score"][0], 3)
        diffs = [abs(a[0] - b[0]) for a, b in zip(rows["score"][1:], want[1:], strict=True)]
        same_top = sum(list(a[1]) == list(b[1]) for a, b in zip(rows["score"][1:], want[1:], strict=True))
        print(f"graphs={graphs}: scored rows vs one shot: max |diff| {max(diffs):.2e}, same top-3 {same_top}/699")
        assert max(diffs) < 1e-3 and same_top >= 0.98 * 699
        assert eng.blocks.free_pages == eng.blocks.num_pages
        results[graphs] = {rid: toks[rid] for rid in mix}
    assert results[True] == results[False]
