"""The fused MSA indexer on one GPU (scores, block max and top-k in one pass) through the public API:
``msa_indexer``, and ``launch(plan_indexer(..., output=...))`` for the kernel with its top-k stage left
out (``score_sum``) or its block scores written out (``block_scores``, the input of ``torch.topk``).

Method and inputs as ``prefill.py`` (one request, causal prefill without prefix, structured index
inputs behind a shuffled page table, bf16; median of CUDA-event-timed runs after a warm-up, L2 flushed
before each run). FLOPs: ``2 * d_idx * H_idx * T(T+1)/2``. The top-k stage is the fused kernel's time
minus the score-only kernel's; ``torch.topk(k - 1)`` runs on the materialised block scores where they
fit in memory. On the CPU (``TRITON_INTERPRET=1``) the ``ci`` preset runs the same code on tiny shapes.
``keys``: the index keys' storage, bf16 or quantised with a per-token scale (``int8``: what the engine's FP8
cache keeps, ``kernels/_common/int8.py``; ``fp8``: e4m3), the same keys quantised once before timing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.kernels.prefill import SHAPES, make_inputs, reps_for, timed
from kernels._common.int8 import quantize_int8_rows
from kernels.decode import quantize_index_keys
from kernels.indexer import launch, msa_indexer, plan_indexer

MAX_SCORE_BYTES = 16e9  # block scores [T, H, T / B] fp32 larger than this: no torch.topk row


@dataclass(frozen=True)
class Preset:
    doc: str
    cases: tuple[tuple[str, int], ...]  # (shape, tokens)
    keys: tuple[str, ...] = ("bf16",)  # index-key storage per case: bf16 | int8 | fp8


QUANTISE = {"int8": quantize_int8_rows, "fp8": quantize_index_keys}


PRESETS = {
    "headline": Preset("M3 at 64K, 128K, 256K and 1M (the numbers in kernels/indexer/README.md)",
                       tuple(("m3", t) for t in (65536, 131072, 262144, 1 << 20))),
    "int8": Preset("M3 at 128K and 1M with bf16, int8 (the engine's FP8 cache) and fp8 index keys",
                   (("m3", 131072), ("m3", 1 << 20)), keys=("bf16", "int8", "fp8")),
    "ci": Preset("tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)", (("tiny", 192), ("tiny", 320)),
                 keys=("bf16", "int8")),
}


def case_rows(name: str, t: int, keys: tuple[str, ...] = ("bf16",)) -> list[dict]:
    """One row per index-key storage in ``keys``, all on the same inputs (made once, quantised per row)."""
    s = SHAPES[name]
    cuda = torch.cuda.is_available()
    x = make_inputs(t, s, "cuda" if cuda else "cpu")
    bf16 = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    del x
    rows = []
    for key in keys:
        scale = None
        args = bf16
        if key != "bf16":
            k8, scale = QUANTISE[key](bf16[1])
            args = (bf16[0], k8, *bf16[2:])
        rows.append(_row(name, t, key, args, scale, cuda))
        print(rows[-1], flush=True)
        del args
        if cuda:
            torch.cuda.empty_cache()
    return rows


def _row(name: str, t: int, key: str, args: tuple, scale: torch.Tensor | None, cuda: bool) -> dict:
    s = SHAPES[name]
    flops = 2 * s.d_idx * s.hkv * t * (t + 1) / 2
    reps = reps_for(flops / 550e12 * 1e3)
    t_fused = timed(lambda: msa_indexer(*args, s.topk, k_idx_scale=scale), reps, cuda)
    score_only = plan_indexer(args[0], args[1], s.topk, impl="triton", output="score_sum")
    t_score = timed(lambda: launch(score_only, *args, k_idx_scale=scale), reps, cuda)
    topk_stage = max(t_fused - t_score, 1e-3)
    row = dict(case=f"{name} {t // 1024 if t >= 1024 else t}{'K' if t >= 1024 else ''}", keys=key,
               indexer_ms=round(t_fused, 3), indexer_tflops=round(flops / t_fused / 1e9, 1),
               score_only_ms=round(t_score, 3), topk_stage_ms=round(topk_stage, 3), torch_topk_ms=None,
               torch_topk_vs_stage=None)
    if key == "bf16" and t * s.hkv * (t // s.block) * 4 <= MAX_SCORE_BYTES:
        scores = launch(plan_indexer(args[0], args[1], s.topk, impl="triton", output="block_scores"), *args)
        k = min(s.topk - 1, scores.shape[-1])
        t_topk = timed(lambda: torch.topk(scores, k, dim=-1), reps_for(10), cuda)
        row.update(torch_topk_ms=round(t_topk, 3), torch_topk_vs_stage=f"{t_topk / topk_stage:.1f}x")
        del scores
    return row


def run(preset: str) -> list[dict]:
    """The preset's rows, one per case and index-key storage (each printed as it is done)."""
    p = PRESETS[preset]
    return [row for name, t in p.cases for row in case_rows(name, t, p.keys)]


if __name__ == "__main__":  # the same as `python -m benchmarks.kernels.run --op indexer ...`
    import sys

    from benchmarks.kernels.run import main

    main(["--op", "indexer", *sys.argv[1:]])
