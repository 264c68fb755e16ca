"""Run 6 (session 4 of issue 3): the tile kernel with half-block loop steps and a register cap, so that
two 8-warp programs share an SM (one's softmax overlapping the other's MMAs), and the window merge pass
of the rare pairs (tokens that chose the same rare block share its K/V read), against the run-5
default; each variant checked against the fp32 reference on the GPU before it is timed.

    python3 benchmarks/prefill/sweep_run6.py --out DIR [--budget-s 240] [--sizes 131072,65536]   # H200
    python3 benchmarks/prefill/sweep_run6.py --final --out DIR --budget-s 330   # the rows, new defaults
    python3 benchmarks/prefill/sweep_run6.py --dry-cpu --out /tmp/x                             # tiny

Run 7 (session 5) added the sets ``run7`` (the rare pass in the tile program's tail, TMA descriptors),
``run7b`` (TMA, head-major program order), ``run7c`` (32-key steps with TMA), ``run7d`` (the rare
pass's launch; ``knobs_run7.py`` timed its knobs alone), ``run7f`` (rare_max) and ``run7g`` (stages,
hash words), A/B variants in two alternated rounds since calls drift by 1-3%. A label's "default"
means ``TileConfig()`` as it resolved on the day (run 7's sets ran as the defaults moved, see
RESULTS.md); ``--final`` takes whatever ``TileConfig()`` resolves to now.

Timing, FLOP conventions and the checks as ``sweep_run5.py`` (whose helpers it uses): median of
CUDA-event runs after a warm-up, 256 MiB L2 flush before each, structured index inputs, selections of
the real fused indexer, the union build inside every timed attention call.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import DEV, DRY, SHAPES, make_inputs, reps_for, timed  # noqa: E402
from sweep_run5 import case_label, print_rows, run_guarded, start_run, sweep, whole_prefill  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.indexer.op import _launch_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402

BN64 = dict(tile_q=8, block_n=64, num_stages=2, maxnreg=128)
RUN5 = dict(tile_q=8, block_n=0, maxnreg=0, group=False)  # the run-5 default, spelled out
VARIANT_SETS = {  # --set: label -> TileConfig (M3: G = 16, 8-token tiles = 128 rows, 8 warps)
    "sweep1": {  # run 6, sweep 1: 64-key steps and the register cap
        "base: BN 128, 3 stages (run-5 default)": TileConfig(rare_max=2, **RUN5),
        "BN 64, 2 stages, maxnreg 128 (2 programs/SM)": TileConfig(rare_max=2, group=False, **BN64),
        "BN 64, 3 stages, maxnreg 128 (2 programs/SM)": TileConfig(rare_max=2, group=False, **dict(BN64, num_stages=3)),
        "BN 64, 3 stages, no cap (163 regs: 1 program/SM)": TileConfig(rare_max=2, group=False,
                                                                       **dict(BN64, num_stages=3, maxnreg=0)),
        "BN 64, 2 stages, maxnreg 128, rare_max 1": TileConfig(rare_max=1, group=False, **BN64),
        "BN 64, 2 stages, maxnreg 128, rare_max 3": TileConfig(rare_max=3, group=False, **BN64),
        "BN 32, 3 stages, maxnreg 128": TileConfig(rare_max=2, group=False, **dict(BN64, block_n=32, num_stages=3)),
    },
    "sweep2": {  # run 6, sweep 2: the window rare pass
        "base: BN 128, 3 stages, rare_max 2, token pass (run-5 default)": TileConfig(rare_max=2, **RUN5),
        "BN 64, 2 stages, maxnreg 128, rare_max 1, token pass": TileConfig(rare_max=1, group=False, **BN64),
        **{f"BN 64 ..., rare_max {r}, window pass": TileConfig(rare_max=r, rare_pass="window", group=False, **BN64)
           for r in (2, 3, 4)},
        "BN 64 ..., rare_max 3, window pass, 4-token steps, 4 warps": TileConfig(
            rare_max=3, rare_pass="window", rare_chunk=4, rare_warps=4, group=False, **BN64),
        "BN 64 ..., rare_max 5, window pass": TileConfig(rare_max=5, rare_pass="window", group=False, **BN64),
    },
    "grouping": {  # run 6, sweeps 3 and 4: regrouped tiles
        "run-6 default: BN 64, cap 128, 2 stages, rare_max 1, neighbour tiles": TileConfig(group=False),
        "regrouped tiles (greedy per 128 tokens), rare_max 1": TileConfig(group=True),
        "regrouped tiles, rare_max 2": TileConfig(group=True, rare_max=2),
        "regrouped tiles, rare_max 1, 3 stages": TileConfig(group=True, num_stages=3),
    },
    "list": {  # run 6, sweep 6: the rare pass persistent over the compact list of items with rare blocks
        "regrouped, per-item rare pass (default)": TileConfig(),
        "regrouped, listed rare pass, 2 stages": TileConfig(rare_list=True),
        "regrouped, listed rare pass, 1 stage": TileConfig(rare_list=True, rare_stages=1),
        "regrouped, listed rare pass, rare_max 2": TileConfig(rare_list=True, rare_max=2),
    },
    "run7": {  # run 7 (session 5): the rare pass in the tile program's tail, K / V through TMA descriptors
        "run-6 default: regrouped, per-item rare pass": TileConfig(),
        "rare pass in the tile program's tail": TileConfig(rare_pass="tail"),
        "K / V through TMA descriptors": TileConfig(tma=True),
        "TMA + tail": TileConfig(tma=True, rare_pass="tail"),
        "TMA + tail, rare_max 2": TileConfig(tma=True, rare_pass="tail", rare_max=2),
        "TMA + tail, rare_max 3": TileConfig(tma=True, rare_pass="tail", rare_max=3),
        "run-6 default (again: calls drift by a few %)": TileConfig(),
        "TMA + tail (again)": TileConfig(tma=True, rare_pass="tail"),
    },
    "run7b": {  # run 7, sweep 2: TMA descriptors and head-major program order, in two rounds
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("run-6 default", TileConfig()), ("TMA", TileConfig(tma=True)),
            ("head-major", TileConfig(head_major=True)), ("TMA + head-major", TileConfig(tma=True, head_major=True)))},
    },
    "run7c": {  # run 7, sweep 3: 32-key steps with TMA (116 registers: async wgmma under the 128 cap)
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("TMA, 64-key steps (serialised wgmma under the cap)", TileConfig(tma=True)),
            ("TMA, 32-key steps, 2 stages", TileConfig(tma=True, block_n=32)),
            ("TMA, 32-key steps, 3 stages", TileConfig(tma=True, block_n=32, num_stages=3)))},
        "TMA, 32-key steps, 2 stages, lazy rescale": TileConfig(tma=True, block_n=32, lazy=True),
        "TMA, 32-key steps, 4 stages": TileConfig(tma=True, block_n=32, num_stages=4),
    },
    "run7d": {  # run 7, sweep 4: the rare pass's launch (the union build on 1 warp in both)
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("TMA, rare pass 4 warps, whole blocks (before)", TileConfig(rare_warps=4, rare_block_n=0)),
            ("TMA, rare pass 2 warps, 64-key steps (new default)", TileConfig()))},
    },
    "run7f": {  # run 7, sweep 5: rare_max 2 once the rare pass got cheaper
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("run-7 default (rare_max 1)", TileConfig()), ("rare_max 2", TileConfig(rare_max=2)))},
    },
    "run7g": {  # run 7, sweep 6: 3 stages with TMA, 8 hash words with the per-window regrouping
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("run-7 default", TileConfig()), ("3 stages", TileConfig(num_stages=3)),
            ("8 hash words", TileConfig(group_words=8)),
            ("3 stages, 8 hash words", TileConfig(num_stages=3, group_words=8)))},
    },
    "run8": {  # run 8, sweep 1: the warp-specialised Gluon tile kernel (whole blocks per step, 2 stages)
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("run-7 default (Triton tile kernel)", TileConfig(kernel="triton")),
            ("gluon, one program per item", TileConfig(kernel="gluon", persistent=False)),
            ("gluon persistent", TileConfig(kernel="gluon", persistent=True)),
            ("gluon persistent, 3 stages", TileConfig(kernel="gluon", persistent=True, num_stages=3)))},
    },
    "run9": {  # run 9: the rare pairs bucketed into items that share K / V (rare_pass "items"), rare_max 1 / 2
        **{f"{name}{sfx}": cfg for sfx in ("", " (round 2)") for name, cfg in (
            ("run-8 default (token pass, rare_max 1)", TileConfig(kernel="gluon", rare_pass="token", rare_max=1)),
            ("items pass, rare_max 1", TileConfig(kernel="gluon", rare_pass="items", rare_max=1)),
            ("items pass, rare_max 2", TileConfig(kernel="gluon", rare_pass="items", rare_max=2)))},
    },
    "words": {  # run 6, sweep 5: fewer hash words (a cheaper regrouping, coarser similarity)
        "regrouped tiles, 8 hash words": TileConfig(group=True, group_words=8),
        "regrouped tiles, 4 hash words": TileConfig(group=True, group_words=4),
        "regrouped tiles, 2 hash words": TileConfig(group=True, group_words=2),
    },
}


def dense_1m_cold(rows, t: int, peak: float, total_ms: float) -> None:
    """One cold cuDNN causal run at ``t`` (no warm-up: ~37 s at 1M), against the MSA total."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shape = SHAPES["m3"]
    gen = torch.Generator(device=DEV).manual_seed(1)
    q = torch.randn(1, shape["hq"], t, shape["d"], device=DEV, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, shape["hq"], t, shape["d"], device=DEV, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, shape["hq"], t, shape["d"], device=DEV, dtype=torch.bfloat16, generator=gen)
    sync = (lambda: None) if DRY else torch.cuda.synchronize
    with sdpa_kernel([SDPBackend.MATH if DRY else SDPBackend.CUDNN_ATTENTION]):
        sync()
        start = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        sync()
    ms = (time.perf_counter() - start) * 1e3
    flops = 4 * shape["d"] * shape["hq"] * t * (t + 1) / 2
    rows.add(case_label("m3", t), "dense causal SDPA (cuDNN), one cold run, re-measured", ms, flops,
             f"MSA speed-up {ms / total_ms:.1f}x")


def topk_rounds(rows, t: int, rounds: int = 5) -> None:
    """SmolLM2 top-k stage (fused indexer minus its score-only twin) vs ``torch.topk`` on the same
    scores, in alternating rounds; the median ratio and the range."""
    shape = SHAPES["smollm2"]
    x = make_inputs(t, shape, True)
    idx = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    r = reps_for(10)
    scores = _launch_indexer(*idx, 4, mode=1)
    ratios = []
    for _ in range(rounds):
        t_f = timed(lambda: msa_indexer(*idx, shape["topk"]), r)
        t_s = timed(lambda: _launch_indexer(*idx, 4, mode=2), r)
        t_k = timed(lambda: torch.topk(scores, min(shape["topk"] - 1, scores.shape[-1]), dim=-1), r)
        ratios.append((t_k / max(t_f - t_s, 1e-3), t_f - t_s, t_k))
    ratios.sort()
    med = ratios[len(ratios) // 2]
    rows.add(case_label("smollm2", t), f"top-k stage vs torch.topk, {rounds} alternating rounds", med[1], None,
             f"median {med[0]:.2f}x (range {ratios[0][0]:.2f}-{ratios[-1][0]:.2f}x); torch.topk {med[2]:.3f} ms")


def final(rows, peak, deadline, save) -> None:
    """The rows with the defaults (explicit launch of ``TileConfig()`` resolved for the GPU; runs 6-8): M3
    32K..1M vs cuDNN (1M: one cold dense run, re-measured), the SmolLM2 rows and the top-k rounds."""
    plan = [("m3", 65536), ("m3", 131072), ("m3", 32768), ("m3", 262144), ("smollm2", 131072),
            ("smollm2", 32768), ("topk", 131072), ("m3", 1 << 20)]
    if DRY:
        plan = [("m3", 384), ("smollm2", 512), ("topk", 512), ("m3", 640)]
    for name, t in plan:
        if time.time() > deadline:
            rows.add(case_label(name, t), "skipped: budget spent", float("nan"))
            continue
        run_guarded(lambda: final_case(rows, name, t, peak, deadline), save)


def final_case(rows, name: str, t: int, peak: float, deadline: float) -> None:
    """One row group of ``final``: the top-k rounds, or the whole prefill (1M: dense re-measured cold)."""
    if name == "topk":
        topk_rounds(rows, t)
        return
    big = t >= (640 if DRY else 1 << 20)
    sm90 = not DRY and torch.cuda.get_device_capability()[0] == 9  # the default tile kernel is the device's
    whole_prefill(rows, name, t, TileConfig().resolved(16, 128, sm90=sm90) if name == "m3" else None, peak, deadline,
                  dense=not big, topk_baseline=False)
    if big:
        total = [r for r in rows.rows if r["stage"] == "MSA total = indexer + attention"][-1]["ms"]
        rows.rows = [r for r in rows.rows if "run 1 number reused" not in r["stage"]]
        dense_1m_cold(rows, t, peak, total)


def main() -> None:
    import argparse
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--sizes", default="131072,65536")
    extra.add_argument("--final", action="store_true", help="the rows with the current defaults (no sweep)")
    extra.add_argument("--grouping", action="store_true", help="time the regrouping kernel alone too")
    extra.add_argument("--set", default="grouping", choices=sorted(VARIANT_SETS))
    own, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0]] + rest
    args, deadline, peak, info, rows = start_run(240)
    sizes = [int(s) for s in own.sizes.split(",")] if not DRY else [384]
    variants = {k: v.resolved(16, 128) for k, v in VARIANT_SETS[own.set].items()}
    variants = variants if not DRY else dict(list(variants.items())[:3])
    save = lambda: Path(args.out, "run6_final.json" if own.final else "run6.json").write_text(  # noqa: E731
        json.dumps(dict(info=info, rows=rows.rows), indent=1))
    if own.final:
        final(rows, peak, deadline, save)
        sizes = []
    def sweep_case(t: int) -> None:
        best, good, ids, x = sweep(rows, "m3", t, variants, deadline, analyse=False)
        if own.grouping:
            tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
            want = group_tiles(ids, x["cu_seqlens_q"], *tiles, 8)
            # run 6 timed (1, 8), (2, 8), (4, 8), (1, 4), (1, 2); run 7 (heads side by side) these:
            for warps, words in ((1, 4), (2, 4), (4, 4), (8, 4), (2, 2), (4, 8)):
                same = torch.equal(group_tiles(ids, x["cu_seqlens_q"], *tiles, 8, num_warps=warps, words=words),
                                   want)
                rows.add(case_label("m3", t), f"regrouping kernel alone (group_tiles), {warps} warps, {words} words",
                         timed(lambda: group_tiles(ids, x["cu_seqlens_q"], *tiles, 8, num_warps=warps,
                                                   words=words), 10),
                         None, f"same map as the default: {same}")
        rows.add("m3", f"T={t}: fastest correct: {best}", float("nan"), None, json.dumps(good))
        save()
        whole_prefill(rows, "m3", t, variants.get(best), peak, deadline, x=x, ids=ids, dense=False)

    for t in sizes:
        if time.time() > deadline:
            break
        run_guarded(lambda: sweep_case(t), save)
    print_rows(rows)


if __name__ == "__main__":
    main()
