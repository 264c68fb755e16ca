"""Tensor parallelism (`engine.parallel`) on the CPU: real worker processes over gloo, fp32. TP=2 against one
process on a tiny random Llama-family checkpoint with 2 KV heads (dense, and msa-ref through a random MSA
adapter on a 700-token prompt, 6 blocks of 128 with top-4: truly sparse) and on a tiny random MiniMax-M3
(KV heads split, experts split as expert parallel); `msa-eval generate --tensor-parallel-size 2`; the bad
sizes; and no worker left once the LLM is deleted or rank 0 is killed."""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import EngineError
from engine.testing import all_logits

KW = dict(device="cpu", max_model_len=2048, kv_cache_tokens=4096, progress=False)
GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)
MSA_EVAL = Path(sys.executable).with_name("msa-eval")
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads worker processes from /proc")


def write_llama(path: Path, seed: int = 0) -> None:
    """A random 2-layer Llama directory (4 query / 2 KV heads of d 64, MLP 96) with a byte-level tokenizer;
    weights large enough that greedy decoding does not repeat one token."""
    from safetensors.torch import save_file

    from engine.m3.testing import write_tokenizer

    path.mkdir(parents=True, exist_ok=True)
    hidden, heads, kv, d, inter, vocab, layers = 128, 4, 2, 64, 96, 300, 2
    (path / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=d, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=0,
        eos_token_id=7, tie_word_embeddings=False)))
    g = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) / cols ** 0.5

    w = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g), "lm_head.weight": 4 * mat(vocab, hidden),
         "model.norm.weight": 1 + 0.1 * torch.randn(hidden, generator=g)}
    for i in range(layers):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
              p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
              p + "self_attn.q_proj.weight": mat(heads * d, hidden), p + "self_attn.k_proj.weight": mat(kv * d, hidden),
              p + "self_attn.v_proj.weight": mat(kv * d, hidden), p + "self_attn.o_proj.weight": mat(hidden, heads * d),
              p + "mlp.gate_proj.weight": mat(inter, hidden), p + "mlp.up_proj.weight": mat(inter, hidden),
              p + "mlp.down_proj.weight": mat(hidden, inter)}
    save_file(w, str(path / "model.safetensors"))
    write_tokenizer(path)


def write_adapter(model_dir: Path, out: Path) -> None:
    """A random MSA adapter for `model_dir` (every layer MSA, block 128, top-4, d_idx 64)."""
    from engine.loader import load
    from engine.msa.adapter import base_fingerprint, save_adapter
    from engine.testing import random_indexer

    loaded = load(str(model_dir), progress=False)
    torch.manual_seed(0)
    ix = random_indexer(loaded.config, "cpu", torch.float32, topk=4)
    save_adapter(out, ix.projections, {"model_id": "tiny-llama",
                                       "fingerprint": base_fingerprint(loaded.config, loaded.weights)})


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(10, 290, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _workers() -> set[int]:
    """Live `engine.parallel.worker` processes."""
    pids = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if b"engine.parallel.worker" in cmd and _alive(int(d.name)):
                pids.add(int(d.name))
    return pids


def _gone(pids: list[int], timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tp") / "llama"
    write_llama(d)
    write_adapter(d, d.parent / "adapter")
    return d


@pytest.fixture(scope="module")
def single(model_dir) -> LLM:
    return LLM(str(model_dir), **KW)


def test_dense_tp2_equals_one_process(model_dir, single):
    tp = LLM(str(model_dir), tensor_parallel_size=2, **KW)
    try:
        assert tp.model.cfg.num_kv_heads == 1 and tp.cache.k[0].shape[1] == 1  # rank 0 holds its half
        ids = _ids(300, 0)
        one = all_logits(single, ids)
        assert _rel(all_logits(tp, ids), one) <= 1e-5
        assert _rel(all_logits(tp, ids, chunk=128), one) <= 1e-5  # chunks attend to their cached prefix
        prompts = [_ids(50, 1), _ids(90, 2)]  # batched decode steps
        ref = [o.token_ids for o in single.generate(prompts, GREEDY)]
        assert len(set(ref[0])) > 4  # the random model does not repeat one token
        assert [o.token_ids for o in tp.generate(prompts, GREEDY)] == ref
    finally:
        tp.close()


def test_msa_ref_tp2_equals_one_process_and_workers_exit_when_deleted(model_dir, single):
    model = f"{model_dir}+{model_dir.parent / 'adapter'}"
    one = LLM(model, attention="msa-ref", **KW)
    tp = LLM(model, attention="msa-ref", tensor_parallel_size=2, **KW)
    ids = _ids(700, 3)
    ref = all_logits(one, ids)
    assert _rel(ref, all_logits(single, ids)) > 1e-2  # the selection drops blocks: not dense attention
    assert _rel(all_logits(tp, ids), ref) <= 1e-5
    assert tp.generate(ids, GREEDY)[0].token_ids == one.generate(ids, GREEDY)[0].token_ids
    pids = [p.pid for p in tp.parallel._workers]
    assert pids and all(_alive(p) for p in pids)
    del tp
    gc.collect()
    assert _gone(pids), "a worker outlived its deleted LLM"


def test_a_failed_forward_stops_the_group(model_dir):
    """A forward that fails midway on rank 0 (after the step went out) fails its requests, stops the workers (they
    may wait in a collective) and every later forward says to reload."""
    tp = LLM(str(model_dir), tensor_parallel_size=2, **KW)
    pids = [p.pid for p in tp.parallel._workers]

    def fault(*args, **kwargs):
        raise RuntimeError("injected fault")

    tp.model.shard.layers[1].forward = fault
    with pytest.raises(RuntimeError, match="injected fault"):
        tp.generate(_ids(20, 5), GREEDY)
    assert _gone(pids, timeout=5)
    with pytest.raises(EngineError, match=r"stopped after a forward failed \(RuntimeError: injected fault\).*load it "
                                          "again"):
        tp.generate(_ids(20, 5), GREEDY)
    tp.close()


def test_cli_generate_tp2_and_no_worker_after_exit(model_dir, single):
    prompt = "The quick brown fox"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(MSA_EVAL), "generate", "--model", str(model_dir), "--device", "cpu", "--max-tokens", "16",
           "--tensor-parallel-size", "2", "--json", prompt]
    before = _workers()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    assert _gone(list(_workers() - before)), "a worker outlived the command"  # stopped at process exit
    want = single.generate(prompt, SamplingParams(max_tokens=16))[0]
    got = json.loads(r.stdout)
    assert got["completion_tokens"] == 16 and got["text"] == want.text


def test_workers_exit_when_rank0_is_killed(model_dir):
    script = (f"from engine import LLM\nllm = LLM({str(model_dir)!r}, tensor_parallel_size=2, **{KW!r})\n"
              "print(*[p.pid for p in llm.parallel._workers], flush=True)\nimport time\ntime.sleep(300)\n")
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        pids = [int(p) for p in rank0.stdout.readline().split()]
        assert len(pids) == 1 and _alive(pids[0])
    finally:
        rank0.send_signal(signal.SIGKILL)
        rank0.wait()
    assert _gone(pids), "a worker outlived rank 0"


def test_bad_sizes_name_the_fix_and_start_nothing(model_dir):
    from engine.config import ModelConfig
    from engine.m3.settings import read_m3_settings
    from engine.parallel.sharding import check_size

    before = _workers()
    cases = [(dict(tensor_parallel_size=3),
              "tensor_parallel_size 3 does not divide the model's 2 KV heads: use one of 1, 2"),
             (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1, got 0"),
             (dict(tensor_parallel_size=2, weights="q4"), "weights='q4' is a single-process CPU mode")]
    if torch.cuda.device_count() < 2:
        cases.append((dict(tensor_parallel_size=2, device="cuda"), "needs GPUs cuda:0..cuda:1, this machine has"))
    for kw, msg in cases:
        with pytest.raises(EngineError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            LLM(str(model_dir), **{**KW, **kw})
    assert _workers() == before
    llama = ModelConfig(arch="llama", vocab_size=300, hidden_size=128, num_layers=2, num_heads=8, num_kv_heads=4,
                        head_dim=16, intermediate_size=98, max_position=2048)
    with pytest.raises(EngineError, match="does not divide the model's 98 MLP intermediate size: use one of 1, 2$"):
        check_size(llama, 4)
    tc = dict(num_local_experts=6, shared_intermediate_size=48, dense_intermediate_size=96,
              mlp_layer_types=["dense", "sparse"])
    m3 = ModelConfig(arch="minimax_m3", vocab_size=300, hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=4,
                     head_dim=64, intermediate_size=96, max_position=2048, m3=read_m3_settings(tc, 2, 64))
    with pytest.raises(EngineError, match="does not divide the model's 6 routed experts: use one of 1, 2$"):
        check_size(m3, 4)


def test_cli_bad_size_is_one_line(model_dir):
    for n, msg in (("3", "does not divide the model's 2 KV heads: use one of 1, 2"), ("0", "0 is not in the range")):
        r = subprocess.run([str(MSA_EVAL), "generate", "--model", str(model_dir), "--device", "cpu",
                            "--tensor-parallel-size", n, "hi"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_m3_tp2_equals_one_process(tmp_path):
    pytest.importorskip("transformers")
    from engine.m3.testing import text_config, write_checkpoint

    write_checkpoint(tmp_path, text_config(num_layers=4))  # full/sparse attention, dense + 3 MoE MLPs, 4 experts
    one = LLM(str(tmp_path), attention="msa", **KW)
    tp = LLM(str(tmp_path), attention="msa", tensor_parallel_size=2, **KW)
    try:
        assert tp.model.layers[1].mlp.w13.shape[0] == 2  # rank 0 holds 2 of the 4 experts
        ids = _ids(700, 4)
        assert _rel(all_logits(tp, ids), all_logits(one, ids)) <= 1e-5
        assert tp.generate(ids[:200], GREEDY)[0].token_ids == one.generate(ids[:200], GREEDY)[0].token_ids
    finally:
        tp.close()


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_expert_shards_sum_to_the_moe(impl):
    """Two ranks' `ExpertShard`s (2 of 4 experts each, the torch path and the Triton op's first_expert) add up
    to the whole MoE block's routed part (each shard here keeps the whole shared expert: subtracted once)."""
    if impl == "triton":
        pytest.importorskip("triton")
    from engine.config import from_hf_config
    from engine.m3.moe import MoE
    from engine.m3.testing import text_config
    from engine.parallel.model import ExpertShard
    from engine.parallel.sharding import expert_range

    cfg = from_hf_config({**text_config(num_layers=2, experts=4), "model_type": "minimax_m3_vl_text"})
    g = torch.Generator().manual_seed(0)
    whole = MoE(cfg)
    with torch.no_grad():
        for p in whole.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(40, cfg.hidden_size, generator=g)
    parts = []
    for r in range(2):
        with torch.device("meta"):
            shard = ExpertShard(cfg, expert_range(cfg, r, 2))
        shard = shard.to_empty(device="cpu")
        experts = expert_range(cfg, r, 2)
        state = {k: (v[experts.start:experts.stop] if k in ("w13", "w2") else v) for k, v in whole.state_dict().items()}
        shard.load_state_dict(state)
        shard.impl = impl
        parts.append(shard(x))
    ref = whole(x)
    assert _rel(parts[0] + parts[1] - whole.shared(x), ref) <= 1e-5
