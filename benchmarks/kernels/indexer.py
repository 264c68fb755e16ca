"""The fused MSA indexer on one GPU (scores, block max and top-k in one pass) through the public API:
``msa_indexer``, and ``launch(plan_indexer(..., output=...))`` for the kernel with its top-k stage left
out (``score_sum``) or its block scores written out (``block_scores``, the input of ``torch.topk``).

Method and inputs as ``prefill.py`` (one request, causal prefill without prefix, structured index
inputs behind a shuffled page table, bf16; median of CUDA-event-timed runs after a warm-up, L2 flushed
before each run). FLOPs: ``2 * d_idx * H_idx * T(T+1)/2``. The top-k stage is the fused kernel's time
minus the score-only kernel's; ``torch.topk(k - 1)`` runs on the materialised block scores where they
fit in memory. On the CPU (``TRITON_INTERPRET=1``) the ``ci`` preset runs the same code on tiny shapes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks.kernels.prefill import SHAPES, make_inputs, reps_for, timed
from kernels.indexer import launch, msa_indexer, plan_indexer

MAX_SCORE_BYTES = 16e9  # block scores [T, H, T / B] fp32 larger than this: no torch.topk row


@dataclass(frozen=True)
class Preset:
    doc: str
    cases: tuple[tuple[str, int], ...]  # (shape, tokens)


PRESETS = {
    "headline": Preset("M3 at 64K, 128K, 256K and 1M (the numbers in kernels/indexer/README.md)",
                       tuple(("m3", t) for t in (65536, 131072, 262144, 1 << 20))),
    "ci": Preset("tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)", (("tiny", 192), ("tiny", 320))),
}


def case_row(name: str, t: int) -> dict:
    s = SHAPES[name]
    cuda = torch.cuda.is_available()
    x = make_inputs(t, s, "cuda" if cuda else "cpu")
    args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    del x
    flops = 2 * s.d_idx * s.hkv * t * (t + 1) / 2
    reps = reps_for(flops / 550e12 * 1e3)
    t_fused = timed(lambda: msa_indexer(*args, s.topk), reps, cuda)
    score_only = plan_indexer(args[0], args[1], s.topk, impl="triton", output="score_sum")
    t_score = timed(lambda: launch(score_only, *args), reps, cuda)
    topk_stage = max(t_fused - t_score, 1e-3)
    row = dict(case=f"{name} {t // 1024 if t >= 1024 else t}{'K' if t >= 1024 else ''}",
               indexer_ms=round(t_fused, 3), indexer_tflops=round(flops / t_fused / 1e9, 1),
               score_only_ms=round(t_score, 3), topk_stage_ms=round(topk_stage, 3), torch_topk_ms=None,
               torch_topk_vs_stage=None)
    if t * s.hkv * (t // s.block) * 4 <= MAX_SCORE_BYTES:
        scores = launch(plan_indexer(args[0], args[1], s.topk, impl="triton", output="block_scores"), *args)
        k = min(s.topk - 1, scores.shape[-1])
        t_topk = timed(lambda: torch.topk(scores, k, dim=-1), reps_for(10), cuda)
        row.update(torch_topk_ms=round(t_topk, 3), torch_topk_vs_stage=f"{t_topk / topk_stage:.1f}x")
        del scores
    return row


def run(preset: str) -> list[dict]:
    """The preset's rows, one per case (each printed as it is done)."""
    rows = []
    for name, t in PRESETS[preset].cases:
        rows.append(case_row(name, t))
        print(rows[-1], flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":  # the same as `python -m benchmarks.kernels.run --op indexer ...`
    import sys

    from benchmarks.kernels.run import main

    main(["--op", "indexer", *sys.argv[1:]])
