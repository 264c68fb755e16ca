"""CPU serving fast paths: batched decode attention, row cache writes, 4-bit / bf16 weight modes."""
import inspect
import textwrap

import pytest
import torch
import torch.nn.functional as F

from engine import SamplingParams
from engine.attention.dense import DenseAttention
from engine.attention.meta import AttentionMeta
from engine.config import ModelConfig
from engine.cpu_decode import CpuDecodePlan, cache_rows, rope_and_write
from engine.cpu_linear import Int4Linear
from engine.cpu_weights import attach_cpu_weights
from engine.errors import EngineError
from engine.gpu.ops import rope_cache_ref
from engine.loader.gguf_q4 import Q4Blocks, read_q4_blocks
from tests.engine.test_parity_hf import all_logits


@pytest.fixture(autouse=True)
def one_torch_thread():
    """One thread: on a busy 2-core VM the int4 kernel's parallel regions stall when a core is taken
    (measured 30x slower at 2 threads under load), and these tests time nothing."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def decode_meta(lens: list[int], page: int, num_pages: int, gen: torch.Generator) -> AttentionMeta:
    """A decode step of requests with `lens` keys each, on shuffled physical pages."""
    perm = torch.randperm(num_pages, generator=gen).tolist()
    tables, page_lists = [], []
    for n in lens:
        k = -(-n // page)
        page_lists.append([perm.pop() for _ in range(k)])
        tables.append(torch.tensor(page_lists[-1], dtype=torch.int32))
    pt = torch.nn.utils.rnn.pad_sequence(tables, batch_first=True, padding_value=-1)
    r = len(lens)
    last = torch.tensor([n - 1 for n in lens])
    return AttentionMeta(
        cu_seqlens_q=torch.arange(r + 1, dtype=torch.int32), seq_lens_kv=torch.tensor(lens, dtype=torch.int32),
        page_table=pt, slot_pages=torch.tensor([p[-1] for p in page_lists]), slot_offsets=last % page,
        q_lens=[1] * r, kv_lens=list(lens), page_lists=page_lists, is_decode=True,
        seq_lens_host=torch.tensor(lens, dtype=torch.int32), page_table_host=pt)


@pytest.mark.parametrize("page,lens,hkv,g", [(64, [1, 63, 64, 65, 130], 3, 3), (128, [129, 160, 200, 256], 2, 4),
                                            (128, [77], 1, 1)])
def test_decode_plan_equals_per_request_sdpa(page, lens, hkv, g):
    gen = torch.Generator().manual_seed(len(lens))
    d, num_pages = 64, 24
    kc = torch.randn(num_pages, hkv, page, d, generator=gen)
    vc = torch.randn(num_pages, hkv, page, d, generator=gen)
    q = torch.randn(len(lens), hkv * g, d, generator=gen)
    meta = decode_meta(lens, page, num_pages, gen)
    attn = DenseAttention(d ** -0.5)
    ref = attn(0, q, kc, vc, meta)  # no plan: one SDPA per request over its gathered pages
    plan = CpuDecodePlan.build(meta, hkv, page, d ** -0.5)
    assert (plan.key_bias is None) == (len(set(lens)) == 1)
    out = plan.run(q, kc, vc)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rope_and_write_equals_reference():
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, page, t = 6, 2, 32, 64, 5
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
    ang = torch.randn(t, d // 2, generator=gen)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    pages, offs = torch.tensor([3, 3, 0, 7, 1]), torch.tensor([0, 63, 5, 17, 40])
    caches = [torch.zeros(8, hkv, page, d) for _ in range(4)]
    q_ref = rope_cache_ref(qkv, cos, sin, caches[0], caches[1], pages, offs, hq, hkv)
    q = rope_and_write(qkv, cos, sin, caches[2], caches[3], cache_rows(pages, offs, hkv, page), hq, hkv)
    assert torch.equal(q, q_ref)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    assert caches[2].abs().sum() > 0


def test_int4_linear_multiplies_by_its_blocks():
    gen = torch.Generator().manual_seed(4)
    n, k = 96, 128
    blocks = Q4Blocks(torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
                      torch.rand(n, k // 32, generator=gen) * 0.02, torch.randn(n, k // 32, generator=gen) * 0.1)
    bias = torch.randn(n, generator=gen)
    lin = Int4Linear(blocks.codes, blocks.scale, blocks.offset, bias)
    x = torch.randn(7, k, generator=gen)
    ref = F.linear(x.bfloat16().float(), blocks.dequantize(), bias)  # activations are rounded to bf16
    y = lin(x)
    assert y.dtype == torch.float32 and y.shape == (7, n)  # float32 with a bias (bf16 without)
    assert ((y - ref).norm() / ref.norm()).item() < 1e-2
    with pytest.raises(ValueError, match="K % 32"):
        Int4Linear(blocks.codes[:, :100], blocks.scale, blocks.offset)
    with pytest.raises(ValueError, match="0..15"):
        Int4Linear(blocks.codes.int() + 16, blocks.scale, blocks.offset)


def test_gguf_4bit_blocks_are_the_dequantized_weights(default_llm):
    """The codes we multiply by are bit-for-bit the weights of the exact fp32 path (Q/K un-permuted)."""
    q4 = read_q4_blocks(default_llm.model_path, default_llm.config)
    for i in (0, 29):
        L = default_llm.model.layers[i]
        p = f"model.layers.{i}."
        qkv = torch.cat([q4[p + f"self_attn.{n}_proj.weight"].dequantize() for n in "qkv"])
        assert torch.equal(qkv, L.qkv)
        gate_up = torch.cat([q4[p + f"mlp.{n}_proj.weight"].dequantize() for n in ("gate", "up")])
        assert torch.equal(gate_up, L.gate_up)
        assert torch.equal(q4[p + "mlp.down_proj.weight"].dequantize(), L.down)
    assert "model.embed_tokens.weight" not in q4  # Q8_0 in this file: runs in bf16 under weights="q4"


@pytest.fixture(scope="module")
def q4_llm():
    from engine import LLM

    return LLM("smollm2-135m", device="cpu", progress=False, weights="q4", kv_cache_tokens=4096)


@pytest.mark.parametrize("chunk", [None, 16])  # one 512-row step (bf16 copy) / 16-row steps (4-bit codes)
def test_q4_logits_stay_close_to_fp32(default_llm, q4_llm, chunk):
    """Tolerance of the fast mode on 512 tokens of real text (Python's textwrap source): top-1 agreement
    >= 95% and mean KL(fp32 || q4) < 5e-3 nats (measured: 98%, 7e-4)."""
    assert q4_llm.weight_counts == {"int4": 120, "int8": 1}
    ids = default_llm.tokenizer.encode(inspect.getsource(textwrap))[:512]
    ref, fast = all_logits(default_llm, ids), all_logits(q4_llm, ids, chunk=chunk)
    assert not fast.isnan().any()
    agree = (fast.argmax(-1) == ref.argmax(-1)).float().mean().item()
    lr, lf = torch.log_softmax(ref, -1), torch.log_softmax(fast, -1)
    kl = (lr.exp() * (lr - lf)).sum(-1).mean().item()
    assert agree >= 0.95 and kl < 5e-3, (agree, kl)


def test_q4_answers_and_batches_like_alone(q4_llm):
    chats = [[{"role": "user", "content": q}] for q in
             ("What is the capital of France?", "Name a prime number.", "What colour is the sky?")]
    p = SamplingParams(max_tokens=12)
    alone = [q4_llm.generate([c], p)[0] for c in chats]
    assert "Paris" in alone[0].text
    batched = q4_llm.generate(chats, p)
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]


def tiny_model(qkv_bias: bool):
    from engine.testing import random_model

    cfg = ModelConfig(arch="qwen2" if qkv_bias else "llama", vocab_size=96, hidden_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=96, max_position=256,
                      qkv_bias=qkv_bias)
    model = random_model(cfg, "cpu", torch.float32, seed=1)
    if qkv_bias:
        for L in model.layers:
            L.qkv_bias.normal_(0, 0.5)
    return model


def test_bf16_mode_wires_every_matmul_and_bias():
    model = tiny_model(qkv_bias=True)
    h = torch.randn(5, 64)
    L = model.layers[0]
    ref = [L.linear("qkv", h), L.linear("gate_up", h), model.logits(h)]
    assert attach_cpu_weights(model, "bf16") == {"bf16": 9}
    fast = [L.linear(n, h) for n in ("qkv", "gate_up")] + [model.logits(h)]
    for a, b in zip(ref, fast, strict=True):
        assert ((a - b).norm() / a.norm()).item() < 1e-2
    assert attach_cpu_weights(model, "fp32") == {"fp32": 9}
    assert L.fast_linears is None and model.fast_lm_head is None
    assert torch.equal(L.linear("qkv", h), ref[0])


def test_weight_mode_errors():
    model = tiny_model(qkv_bias=False)
    with pytest.raises(EngineError, match="unknown weights mode"):
        attach_cpu_weights(model, "q8")
    with pytest.raises(EngineError, match="has none: use weights='bf16'"):
        attach_cpu_weights(model, "q4", {})
    with pytest.raises(EngineError, match="CPU serving mode"):
        attach_cpu_weights(model.to("meta"), "bf16")
    from engine import LLM

    with pytest.raises(EngineError, match="unknown weights mode 'int8'"):
        LLM("smollm2-135m", device="cpu", weights="int8")
