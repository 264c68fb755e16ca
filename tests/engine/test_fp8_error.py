"""The FP8 K/V error budget (`benchmarks/quality/fp8_error.py`, issue 22): the variants on inputs whose answer is
known, and its `ci` preset on the default model's own q / k / v (one 1K essays prompt, CPU)."""
import pytest
import torch

from benchmarks.quality.fp8_error import VARIANTS, _attend, layer_errors
from kernels._common.fp8 import hadamard


def test_e4m3_exact_rows_cost_nothing_and_rounding_q_and_p_does():
    """Rows of e4m3 values with a 448 in each (their row scale is 1): bf16 and every storage variant are exact;
    the Q8KV8 arithmetic (q and P rounded too) is not."""
    g = torch.Generator().manual_seed(0)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0])
    k, v = (grid[torch.randint(0, len(grid), (300, 2, 64), generator=g)] for _ in range(2))
    k = k * torch.where(torch.rand(k.shape, generator=g) < 0.5, -1.0, 1.0)
    k[..., 0], v[..., 5] = 448.0, -448.0
    q = torch.randn(300, 4, 64, generator=g) * 0.01
    err = layer_errors(q, k, v, 40, 0.125, ("bf16", "fp8", "fp8_k", "fp8_v", "q8kv8"))
    assert err["bf16"] == err["fp8"] == err["fp8_k"] == err["fp8_v"] == 0.0
    assert err["q8kv8"] > 1e-3
    with pytest.raises(ValueError, match="unknown variants"):
        layer_errors(q, k, v, 40, 0.125, ("fp4",))


def test_the_hadamard_rotation_leaves_attention_unchanged():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(50, 4, 64, generator=g)
    k, v = torch.randn(200, 2, 64, generator=g), torch.randn(200, 2, 64, generator=g)
    h = hadamard(64, q.device)
    assert torch.allclose(h @ h.T, torch.eye(64), atol=1e-6)
    assert torch.allclose(_attend(q @ h, k @ h, v, 150, 0.125), _attend(q, k, v, 150, 0.125), atol=1e-5)


def test_ci_preset_on_the_default_model():
    from benchmarks.quality.fp8_error import PRESETS, run

    rows = {r["variant"]: r for r in run(PRESETS["ci"])}
    assert set(rows) == set(VARIANTS)
    for r in rows.values():
        assert (r["length"], r["layers"], r["probe"]) == (1024, 30, 32) and 0.0 < r["mean"] < 0.5, r
    err = {name: r["mean"] for name, r in rows.items()}
    # measured on 1K: bf16 0.0044, fp8 0.0535 (K 0.0508, V 0.0166), smoothed K 0.0467, q8kv8 0.0772
    assert err["bf16"] < 0.2 * err["fp8"] and err["fp8_v"] < err["fp8"] < err["q8kv8"]
    assert err["fp8_had"] < err["fp8"] and err["q8kv8_had"] < err["q8kv8"]
