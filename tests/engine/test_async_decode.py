"""One-step-late decode (engine.gpu.async_decode) on the CPU: the engine's async bookkeeping driven by
the eager launcher gives exactly the synchronous tokens, finish reasons and streamed outputs, with
stops on EOS / stop ids / stop strings / max_tokens, a queue longer than the batch and aborts; the
follow-up rule and the packed step buffers on their own."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import SamplingParams
from engine.attention.dense import DenseAttention
from engine.gpu.async_decode import DecodeRow, InflightDecode, ReadyTokens, follow_up_rows
from engine.gpu.step_buffers import StepBuffers
from engine.kv_cache import BlockManager
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.testing import random_engine, random_model, shape_config

PROMPTS = ["Write a short poem about the sea.", "List three prime numbers. " * 5, "Hi",
           "The quick brown fox jumps over the lazy dog. " * 4, "Once upon a time"]


@pytest.fixture(scope="module")
def llm(default_llm):
    """A 2-layer random stack with the default model's vocabulary and tokenizer (fast on the CPU; stop
    strings decode real text), pages of 16 tokens, batches of at most 3 (the 5 prompts queue)."""
    cfg = shape_config("llama-3.1-8b", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=128, vocab_size=default_llm.config.vocab_size, max_position=1024)
    eng = random_engine(random_model(cfg, "cpu", dtype=torch.float32, seed=1), DenseAttention(16 ** -0.5), "cpu",
                        kv_cache_tokens=4096, max_num_seqs=3, page_size=16)
    eng.tokenizer = default_llm.tokenizer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread only spins on a shared 2-core machine
    yield SimpleNamespace(engine=eng, tokenizer=default_llm.tokenizer, _to_ids=default_llm._to_ids)
    torch.set_num_threads(threads)


def drive(llm, prompts, params, asynchronous: bool, abort_after: dict | None = None):
    """Run requests through `step()`; return ({id: streamed tokens}, {id: finished count}, outputs, stats)."""
    eng = llm.engine
    eng.async_decode = asynchronous
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, p, sp in zip(ids, prompts, params, strict=True):
        eng.add_request(rid, llm._to_ids(p), sp)
    streamed = {rid: [] for rid in ids}
    finished = dict.fromkeys(ids, 0)
    empty_calls = 0
    try:
        while eng.has_unfinished():
            outs = eng.step()
            empty_calls += not outs
            for o in outs:
                streamed[o.request_id] += o.new_token_ids
                finished[o.request_id] += o.finished
            for rid, n in (abort_after or {}).items():
                if len(streamed[rid]) >= n and rid in eng.seqs and not eng.seqs[rid].finished:
                    eng.abort(rid)
        final = {rid: eng.pop_finished(rid) for rid in ids if rid in eng.seqs}
    finally:
        eng.async_decode = False
    return streamed, finished, final, empty_calls


def test_async_equals_sync_with_every_stop_kind(llm):
    free = SamplingParams(max_tokens=14, ignore_eos=True)
    ref, _, _, _ = drive(llm, PROMPTS, [free] * 5, asynchronous=False)
    stop_id = ref["r0"][4]
    stop_text = llm.tokenizer.decode(ref["r3"][:7])[-3:]
    assert stop_text.strip(), "pick a visible stop string"
    params = [SamplingParams(max_tokens=14, stop_token_ids=[stop_id], ignore_eos=True),
              SamplingParams(max_tokens=5, ignore_eos=True),
              SamplingParams(max_tokens=40),  # EOS allowed
              SamplingParams(max_tokens=14, stop=[stop_text], ignore_eos=True),
              SamplingParams(max_tokens=9, ignore_eos=True)]
    sync = drive(llm, PROMPTS, params, asynchronous=False)
    asyn = drive(llm, PROMPTS, params, asynchronous=True)
    assert asyn[0] == sync[0]
    for rid, seq in asyn[2].items():
        assert seq.output_ids == sync[2][rid].output_ids == asyn[0][rid]
        assert seq.finish_reason == sync[2][rid].finish_reason
        assert seq.num_computed == sync[2][rid].num_computed
    assert all(n == 1 for n in asyn[1].values())  # exactly one finished output per request
    # the stops really happened before max_tokens, so follow-up rows of stopped requests were dropped
    assert asyn[2]["r0"].finish_reason == "stop" and len(asyn[0]["r0"]) <= 5
    assert asyn[2]["r3"].finish_reason == "stop" and len(asyn[0]["r3"]) <= 7
    assert [len(asyn[0][r]) for r in ("r1", "r4")] == [5, 9]
    assert asyn[3] > sync[3]  # calls that only launched a step: the async path ran
    assert llm.engine._inflight is None and not llm.engine.scheduler.running and llm.engine.blocks.free_pages == \
        llm.engine.blocks.num_pages


def test_async_abort_midway_keeps_the_others_exact(llm):
    p = [SamplingParams(max_tokens=10, ignore_eos=True)] * 3
    ref, _, _, _ = drive(llm, PROMPTS[:3], p, asynchronous=False)
    got, finished, final, _ = drive(llm, PROMPTS[:3], p, asynchronous=True, abort_after={"r1": 3})
    assert got["r0"] == ref["r0"] and got["r2"] == ref["r2"]
    assert 3 <= len(got["r1"]) < 10 and got["r1"] == ref["r1"][:len(got["r1"])]
    assert "r1" not in final and finished["r1"] == 0
    assert llm.engine.blocks.free_pages == llm.engine.blocks.num_pages


def _seq(rid: str, prompt: int, out: int, max_tokens: int) -> Sequence:
    s = Sequence(rid, list(range(1, prompt + 1)), SamplingParams(max_tokens=max_tokens), max_len=prompt + max_tokens)
    s.output_ids = [7] * out
    s.num_computed = prompt + out - 1
    return s


def test_follow_up_rows_rules():
    sched = Scheduler(SchedulerConfig(max_num_seqs=3), BlockManager(64, 16))
    a, b, c = _seq("a", 20, 3, 10), _seq("b", 5, 8, 9), _seq("c", 9, 1, 10)  # b's in-flight token is its 9th
    sched.running = [a, b, c]
    prev = InflightDecode([DecodeRow(s, s.total_len - 1, -1) for s in (a, b, c)], ReadyTokens([0, 0, 0]))
    rows = follow_up_rows(prev, sched)
    assert [(r.seq.request_id, r.position, r.src_row) for r in rows] == [("a", 23, 0), ("c", 10, 2)]
    c.finished = True  # stopped on a token at the last completion
    sched.running = [a, b]
    assert [r.seq.request_id for r in follow_up_rows(prev, sched)] == ["a"]
    sched.waiting.append(_seq("w", 4, 0, 4))  # room in the batch: admission must come first
    assert follow_up_rows(prev, sched) is None
    sched.waiting.clear()
    sched.running = [a, b, _seq("new", 4, 0, 4)]  # a running request outside the in-flight step
    assert follow_up_rows(prev, sched) is None
    sched.running = [b]
    a.finished = True
    assert follow_up_rows(prev, sched) is None  # only b is left and its in-flight token ends it


def test_step_buffers_stage_rows_padding_and_page_tables():
    bufs = StepBuffers(4, 6, scratch_page=9, device=torch.device("cpu"))
    ta, tb = [3, 5, 1], [2]
    bufs.write([(-1, 11, 33, 1, 1), (2, 0, 5, 2, 5)], [ta, tb])
    bufs.stage()
    assert bufs.io[:, :2].T.tolist() == [[-1, 11, 33, 1, 1], [2, 0, 5, 2, 5]]
    assert bufs.seq_lens.tolist() == [34, 6, 1, 1]
    assert bufs.page_table[:2].tolist() == [[3, 5, 1, -1, -1, -1], [2, -1, -1, -1, -1, -1]]
    assert bufs.page_table[2:].tolist() == [[9] + [-1] * 5] * 2 and bufs.io[0, 2:].tolist() == [-1, -1]
    assert bufs.io[3, 2:].tolist() == [9, 9]
    bufs.write([(-1, 4, 0, 8, 0)], [[8, 4]])  # a new request in row 0 (new list object): table rewritten
    bufs.stage()
    assert bufs.page_table[0].tolist() == [8, 4, -1, -1, -1, -1] and bufs.page_table[1].tolist() == [9] + [-1] * 5
    assert bufs.seq_lens.tolist() == [1, 1, 1, 1] and bufs.io[1, :2].tolist() == [4, 0]
    host_lens, host_table = bufs.host_views(2)
    assert host_lens.tolist() == [1, 1] and np.shares_memory(host_table.numpy(), bufs.m_table)
    with pytest.raises(ValueError, match="page table holds 6"):
        bufs.write([(-1, 1, 0, 0, 0)], [list(range(7))])
    with pytest.raises(ValueError, match="5 rows"):
        bufs.write([(-1, 1, 0, 0, 0)] * 5, [[1]] * 5)


@pytest.mark.gpu
def test_gpu_async_decode_equals_sync_graphs():
    """The default model from CUDA graphs, bf16: one-step-late decode (the default with graphs on) gives
    exactly the synchronous graph path's tokens, finish reasons and streamed outputs (stops of every
    kind, a queue, an abort); the decode plans were rebound to the step buffers (no plan() per step)."""
    from engine import LLM

    llm = LLM("smollm2-135m", device="cuda", dtype="bfloat16", kv_cache_tokens=32768, max_num_seqs=3,
              progress=False)
    assert llm.engine.async_decode
    free = SamplingParams(max_tokens=20, ignore_eos=True)
    ref, _, _, _ = drive(llm, PROMPTS, [free] * 5, asynchronous=False)
    params = [SamplingParams(max_tokens=20, stop_token_ids=[ref["r0"][6]], ignore_eos=True),
              SamplingParams(max_tokens=7, ignore_eos=True), SamplingParams(max_tokens=30),
              SamplingParams(max_tokens=20, stop=[llm.tokenizer.decode(ref["r3"][:9])[-3:]], ignore_eos=True),
              SamplingParams(max_tokens=13, ignore_eos=True)]
    sync = drive(llm, PROMPTS, params, asynchronous=False)
    asyn = drive(llm, PROMPTS, params, asynchronous=True)
    assert asyn[0] == sync[0] and all(n == 1 for n in asyn[1].values())
    assert {r: s.finish_reason for r, s in asyn[2].items()} == {r: s.finish_reason for r, s in sync[2].items()}
    assert asyn[2]["r0"].finish_reason == "stop" and asyn[3] > sync[3]
    runner = llm.engine.graph_runner
    assert runner.graphs and all(g.bound for g in runner.graphs.values())
    got, finished, final, _ = drive(llm, PROMPTS[:3], [free] * 3, asynchronous=True, abort_after={"r1": 4})
    assert got["r0"] == ref["r0"] and got["r2"] == ref["r2"] and got["r1"] == ref["r1"][:len(got["r1"])]
    assert "r1" not in final and llm.engine.blocks.free_pages == llm.engine.blocks.num_pages
