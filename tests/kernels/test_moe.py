"""The MoE ops on the CPU: the Triton kernels in the interpreter at tiny sizes against the fp32 reference,
the reference against transformers' own M3 MoE block, the alignment table, and the one-line input errors."""
import pytest
import torch

from kernels.moe import (
    GemmConfig,
    MoETuning,
    align_tokens,
    aligned_rows,
    moe_experts,
    moe_route,
    plan_experts,
    reference,
)
from kernels.testing import assert_close

ALPHA, LIMIT, SCALING = 1.702, 7.0, 2.0


def make(t, h=48, inter=24, e=8, k=2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    router = torch.randn(e, h, generator=g) / h**0.5
    bias = torch.randn(e, generator=g) * 0.05
    w13 = torch.randn(e, 2 * inter, h, generator=g) * (3 / h**0.5)  # large enough that the clamps act
    w2 = torch.randn(e, h, inter, generator=g) / inter**0.5
    weights, ids = reference.route_reference(x, router, bias, k)
    return dict(x=x.to(dtype), router=router.to(dtype), bias=bias, w13=w13.to(dtype), w2=w2.to(dtype),
                weights=weights, ids=ids)


def experts(c, **kw):
    return moe_experts(c["x"], c["w13"], c["w2"], c["weights"], c["ids"], alpha=ALPHA, limit=LIMIT,
                       scaling=SCALING, **kw)


def expected(c):
    return reference.experts_reference(c["x"], c["w13"], c["w2"], c["weights"], c["ids"], alpha=ALPHA,
                                       limit=LIMIT, scaling=SCALING)


# -- the reference against transformers --------------------------------------------------------------

def test_reference_matches_transformers_sparse_moe_block():
    mod = pytest.importorskip("transformers.models.minimax_m3_vl.modeling_minimax_m3_vl")
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig

    cfg = MiniMaxM3VLTextConfig(hidden_size=32, intermediate_size=16, shared_intermediate_size=24,
                                num_local_experts=6, num_experts_per_tok=3, routed_scaling_factor=2.5)
    torch.manual_seed(0)
    block = mod.MiniMaxM3VLSparseMoeBlock(cfg).float()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.4)
    block.gate.e_score_correction_bias.normal_(std=0.1)
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        want = block(x).reshape(-1, 32)
        xf = x.reshape(-1, 32)
        weights, ids = moe_route(xf, block.gate.weight, block.gate.e_score_correction_bias, 3, impl="triton")
        _, hf_w, hf_ids = block.gate(xf)
        assert torch.equal(ids.sort(-1).values, hf_ids.to(torch.int32).sort(-1).values)
        assert_close("weights as sets", hf_w.gather(1, hf_ids.argsort(-1)), weights.gather(1, ids.argsort(-1)),
                     1e-6)
        routed = moe_experts(xf, block.experts.gate_up_proj, block.experts.down_proj, weights, ids,
                             alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit, scaling=cfg.routed_scaling_factor,
                             impl="triton")
        got = routed + block.shared_experts(xf)
    assert_close("moe block", want, got, 1e-5)


# -- router --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_route_kernel_matches_reference(k):
    c = make(21, e=12, k=k, seed=k)
    w, ids = moe_route(c["x"], c["router"], c["bias"], k, impl="triton")
    ref_w, ref_ids = reference.route_reference(c["x"], c["router"], c["bias"], k)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    assert_close("weights", ref_w, w, 1e-6)
    assert torch.allclose(w.sum(-1), torch.ones(21))


def test_route_bias_chooses_but_does_not_weigh():
    c = make(9, e=8, k=2)
    bias = torch.zeros(8)
    bias[5] = 10.0  # expert 5 wins every token's first slot
    w, ids = moe_route(c["x"], c["router"], bias, 2, impl="triton")
    assert (ids[:, 0] == 5).all()
    s = torch.sigmoid(c["x"] @ c["router"].t())
    want = s[:, 5] / (s[:, 5] + s.gather(1, ids[:, 1:].long())[:, 0])
    assert_close("weight of the biased expert", want, w[:, 0], 1e-6)


def test_route_bf16_and_no_bias():
    c = make(17, e=8, k=2, dtype=torch.bfloat16)
    w, ids = moe_route(c["x"], c["router"], None, 2, impl="triton")
    ref_w, ref_ids = reference.route_reference(c["x"], c["router"], None, 2)
    assert torch.equal(ids, ref_ids)
    assert_close("weights", ref_w, w, 1e-5)


# -- alignment ------------------------------------------------------------------------------------------

def test_alignment_is_sorted_padded_and_complete():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [3, 2], [1, 3]], dtype=torch.int32)  # expert 4..7 empty
    al = align_tokens(ids, 8, 4)
    assert al.sorted_ids.shape[0] == aligned_rows(10, 8, 4) == 36  # 10 + 8 * 3, whole blocks
    s = al.sorted_ids.tolist()
    # expert 0: pairs 1, 4; expert 1: 3, 8; expert 2: 7; expert 3: 0, 2, 5, 6, 9 (two blocks)
    assert s[:16] == [1, 4, 10, 10, 3, 8, 10, 10, 7, 10, 10, 10, 0, 2, 5, 6]
    assert s[16:20] == [9, 10, 10, 10] and set(s[20:]) == {10}
    assert al.block_expert.tolist() == [0, 1, 2, 3, 3, -1, -1, -1, -1]


# -- experts ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_experts_kernel_matches_reference(k):
    c = make(19, k=k, seed=10 + k)  # 19 tokens: no multiple of the 16-row blocks
    out = experts(c, impl="triton")
    assert out.dtype == torch.float32 and out.shape == (19, 48)
    assert_close("routed", expected(c), out, 1e-5)


def test_experts_with_zero_tokens_and_a_crowded_expert():
    c = make(40, e=8, k=2, seed=3)
    ids = torch.randint(0, 3, (40, 2), dtype=torch.int32)  # experts 3..7 get nothing, each of 0..2 > 16 rows
    ids[:, 1] = (ids[:, 0] + 1) % 3
    c["ids"] = ids
    assert_close("routed", expected(c), experts(c, impl="triton"), 1e-5)


def test_experts_bf16_and_odd_k_dims():
    c = make(23, h=40, inter=20, e=5, k=3, seed=4, dtype=torch.bfloat16)  # H, I no multiple of the K step
    out = experts(c, impl="triton")
    assert out.dtype == torch.bfloat16
    assert_close("routed", expected(c), out, 1e-2)


@pytest.mark.parametrize("tokens", [70, 300])  # the middle and the prefill regime of the plan
def test_experts_larger_regimes(tokens):
    c = make(tokens, h=32, inter=16, e=4, k=2, seed=tokens)
    plan = plan_experts(tokens, 2, 4, torch.float32, torch.device("cpu"), impl="triton")
    assert plan.regime == ("middle" if tokens == 70 else "prefill")
    assert_close("routed", expected(c), experts(c, impl="triton"), 1e-5)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_expert_parallel_shards_sum_to_the_whole(impl):
    c = make(29, e=8, k=3, seed=8)
    whole = expected(c)
    shards = ((0, 3), (3, 4), (7, 1))  # (first expert, experts held) of three ranks
    parts = [moe_experts(c["x"], c["w13"][lo:lo + n], c["w2"][lo:lo + n], c["weights"], c["ids"], alpha=ALPHA,
                         limit=LIMIT, scaling=SCALING, first_expert=lo, impl=impl) for lo, n in shards]
    assert_close(f"sum of the shards ({impl})", whole, parts[0] + parts[1] + parts[2], 1e-5)
    nobody = moe_experts(c["x"], c["w13"][:2], c["w2"][:2], c["weights"], c["ids"].clamp(min=2), alpha=ALPHA,
                         limit=LIMIT, scaling=SCALING, first_expert=0, impl=impl)
    assert torch.equal(nobody, torch.zeros_like(nobody))  # every pair another rank's: nothing added


def test_expert_parallel_alignment_drops_foreign_pairs():
    ids = torch.tensor([[5, 2], [3, 9], [4, 5]], dtype=torch.int32)  # this rank: experts 3, 4, 5
    al = align_tokens(ids, 3, 4, first_expert=3)
    s = al.sorted_ids.tolist()
    assert s[:12] == [2, 6, 6, 6, 4, 6, 6, 6, 0, 5, 6, 6]  # pairs 2 | 4 | 0, 5; 1 and 3 dropped and set(s[12:]) == {6}
    assert al.block_expert.tolist()[:4] == [0, 1, 2, -1]


def test_tuning_overrides_tiles():
    c = make(30, k=3, seed=7)
    tuning = MoETuning(block_m=32, gate_up=GemmConfig(16, 16, 4, 2), down=GemmConfig(32, 16, 4, 2), group_m=2)
    plan = plan_experts(30, 3, 8, torch.float32, torch.device("cpu"), impl="triton", tuning=tuning)
    assert (plan.block_m, plan.gate_up.block_n, plan.down.block_n, plan.group_m) == (32, 16, 32, 2)
    assert_close("routed (tuned tiles)", expected(c), experts(c, impl="triton", tuning=tuning), 1e-5)


def test_no_tokens():
    c = make(0)
    assert experts(c, impl="triton").shape == (0, 48)
    w, ids = moe_route(c["x"], c["router"], c["bias"], 2, impl="triton")
    assert w.shape == ids.shape == (0, 2)


def test_auto_on_cpu_is_the_reference():
    c = make(11, k=2, seed=5)
    assert plan_experts(11, 2, 8, torch.float32, torch.device("cpu")).impl == "torch"
    assert torch.equal(experts(c), expected(c))


def test_plan_regimes_from_rows_per_expert():
    cpu = torch.device("cpu")
    assert [plan_experts(t, 4, 128, torch.bfloat16, cpu).regime for t in (1, 64, 512, 1024, 4096)] == \
        ["decode", "decode", "decode", "middle", "prefill"]
    assert plan_experts(1, 4, 128, torch.bfloat16, cpu).block_m == 16
    assert [plan_experts(t, 4, 128, torch.bfloat16, cpu).gate_up.block_n for t in (1, 4, 5, 64)] == [32, 32, 64, 64]
    assert plan_experts(32768, 4, 128, torch.bfloat16, cpu).block_m == 128


# -- bad input ----------------------------------------------------------------------------------------

def test_bad_inputs_name_the_problem():
    c = make(5)
    x, w13, w2, weights, ids = c["x"], c["w13"], c["w2"], c["weights"], c["ids"]
    kw = dict(alpha=ALPHA, limit=LIMIT)
    cases = [
        (lambda: moe_experts(x, w13[:, :, :40], w2, weights, ids, **kw), "w13 must have dim 2"),
        (lambda: moe_experts(x, w13, w2[:, :, :10], weights, ids, **kw), "w2 must have dim 2"),
        (lambda: moe_experts(x, w13[:, :47], w2, weights, ids, **kw), "odd dim 1"),
        (lambda: moe_experts(x, w13.double(), w2, weights, ids, **kw), "w13 must be one of"),
        (lambda: moe_experts(x, w13, w2, weights, ids.long(), **kw), "ids must be one of \\(int32\\)"),
        (lambda: moe_experts(x, w13, w2, weights.double(), ids, **kw), "weights must be one of"),
        (lambda: moe_experts(x, w13, w2, weights[:4], ids[:4], **kw), "ids must have dim 0"),
        (lambda: moe_experts(x, w13, w2, weights[:, :1], ids, **kw), "one shape"),
        (lambda: moe_experts(x[None], w13, w2, weights, ids, **kw), "x must have 2 dims"),
        (lambda: moe_experts(x, w13, w2, weights, ids, impl="cuda", **kw), "impl must be one of"),
        (lambda: moe_experts(x, w13, w2, weights, ids, first_expert=-1, **kw), "first_expert must be None or"),
        (lambda: moe_route(x, c["router"][:, :40], None, 2), "router_w must have dim 1"),
        (lambda: moe_route(x, c["router"], c["bias"][:3], 2), "bias must have length"),
        (lambda: moe_route(x, c["router"], None, 9), "topk must be an int in 1..min"),
        (lambda: moe_route(x.bfloat16(), c["router"].half(), None, 2), "router_w must be one of"),
        (lambda: moe_experts(x, w13.to("meta"), w2, weights, ids, **kw), "w13 is on meta, expected cpu"),
        (lambda: moe_experts(x, w13, w2, weights, ids.to("meta"), **kw), "ids is on meta, expected cpu"),
        (lambda: moe_route(x, c["router"], c["bias"].to("meta"), 2), "bias is on meta, expected cpu"),
        (lambda: moe_experts(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, weights, ids, **kw),
         "w13 needs a unit stride on its last dim"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError, match=msg):
            fn()


def test_triton_on_cpu_without_interpreter_is_an_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    c = make(3)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        experts(c, impl="triton")
