"""GPU checks of the MoE kernels: every plan regime at M3 widths against the fp32 reference, the fused
router at M3 size, and the CUDA-graph capture/replay contract (a graph captured once replays any routing)."""
import pytest
import torch

from kernels.moe import moe_experts, moe_route, plan_experts, reference
from kernels.testing import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

H, INTER, ALPHA, LIMIT, SCALING = 6144, 3072, 1.702, 7.0, 2.0


def weights(e, h=H, inter=INTER, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w13 = (torch.randn(e, 2 * inter, h, generator=g, device="cuda") * (3 / h**0.5)).bfloat16()
    w2 = (torch.randn(e, h, inter, generator=g, device="cuda") / inter**0.5).bfloat16()
    router = (torch.randn(e, h, generator=g, device="cuda") / h**0.5).bfloat16()
    bias = torch.randn(e, generator=g, device="cuda") * 0.01
    return w13, w2, router, bias


@pytest.fixture(scope="module")
def m3_slice():
    return weights(16)  # full M3 widths, 16 experts (1.8 GB)


@pytest.mark.parametrize("tokens, k", [(1, 4), (7, 4), (64, 4), (333, 2), (1000, 4), (3000, 1)])
def test_experts_at_m3_widths(m3_slice, tokens, k):
    w13, w2, router, bias = m3_slice
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    w, ids = moe_route(x, router, bias, k)
    out = moe_experts(x, w13, w2, w, ids, alpha=ALPHA, limit=LIMIT, scaling=SCALING)
    ref = reference.experts_reference(x, w13, w2, w, ids, alpha=ALPHA, limit=LIMIT, scaling=SCALING)
    assert out.dtype == torch.bfloat16
    assert_close(f"routed T={tokens} ({plan_experts(tokens, k, 16, x.dtype, x.device).regime})", ref, out, 1e-2)


@pytest.mark.parametrize("tokens", [64, 1000])
def test_expert_parallel_shards_at_m3_widths(m3_slice, tokens):
    w13, w2, router, bias = m3_slice
    x = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16)
    w, ids = moe_route(x, router, bias, 4)
    ref = reference.experts_reference(x, w13, w2, w, ids, alpha=ALPHA, limit=LIMIT, scaling=SCALING)
    parts = [moe_experts(x, w13[lo:lo + 8], w2[lo:lo + 8], w, ids, alpha=ALPHA, limit=LIMIT, scaling=SCALING,
                         first_expert=lo).float() for lo in (0, 8)]
    assert_close(f"two shards T={tokens}", ref, parts[0] + parts[1], 1e-2)


def test_route_at_m3_size():
    _, _, router, bias = weights(128, inter=16)
    x = torch.randn(4096, H, device="cuda", dtype=torch.bfloat16)
    w, ids = moe_route(x, router, bias, 4)
    ref_w, ref_ids = reference.route_reference(x, router, bias, 4)
    same = (ids.sort(-1).values == ref_ids.sort(-1).values).all(-1).float().mean().item()
    assert same >= 0.995, f"only {same:.2%} of the tokens chose the reference's experts (fp32 near-ties aside)"
    rows = (ids == ref_ids).all(-1)
    assert_close("weights", ref_w[rows], w[rows], 1e-5)


def test_cuda_graph_replays_new_routing(m3_slice):
    w13, w2, router, bias = m3_slice
    x = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)

    def layer():
        w, ids = moe_route(x, router, bias, 4)
        return moe_experts(x, w13, w2, w, ids, alpha=ALPHA, limit=LIMIT, scaling=SCALING)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer()
    for seed in (1, 2):
        x.copy_(torch.randn(64, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        assert_close(f"replay {seed}", layer().float(), out.float(), 1e-3)
