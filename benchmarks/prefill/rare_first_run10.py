"""Run 10: the items pass before the Gluon tile kernel (its first round writes, the tile kernel merges into what it
left: ``TileConfig.rare_first``) against run 9's order (tile kernel, then the items pass merging into its output).
Whole attention as the final rows launch it (``_launch_tile`` with an explicit config: tile table, regrouping,
unions, bucketing and both kernels inside) in alternated rounds, each kernel alone beside it, and each variant's
output compared with run 9's order (M3 shape, structured inputs, selections of the real fused indexer).
The variant was not kept (no gain, RESULTS.md run 10): it runs on commit 7a3e731 with
``run10_patches/rare_first_and_loads_ahead.patch`` applied (``git apply``; calls 3 and 5).

    python3 benchmarks/prefill/rare_first_run10.py --out DIR [--sizes 131072,262144,1048576] [--rounds 2]   # H200
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import SHAPES, make_inputs, run_info, timed, useful_attention_flops  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.gluon_tile import launch_gluon_tile  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, launch_rare_items, tile_unions_for  # noqa: E402

VARIANTS = {
    "run-9 order: tile kernel, then the items pass": TileConfig(kernel="gluon", rare_first=False),
    "items pass first, the tile kernel merges": TileConfig(kernel="gluon", rare_first=True),
    "items pass first, rare_max 3": TileConfig(kernel="gluon", rare_first=True, rare_max=3),
}


def compare(out, lse, ref_out, ref_lse) -> dict:
    """Relative error of ``out`` against ``ref_out`` and the largest LSE difference, 64K tokens at a time."""
    num = den = 0.0
    for i in range(0, out.shape[0], 65536):
        a, b = out[i:i + 65536].float(), ref_out[i:i + 65536].float()
        num += float((a - b).square().sum())
        den += float(b.square().sum())
    return dict(rel_err=(num / den) ** 0.5, lse_max_diff=float((lse - ref_lse).abs().max()),
                nan=bool(torch.isnan(lse).any()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,262144,1048576")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    peak, info = run_info()
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    rows = []
    path = Path(args.out, "rare_first_run10.json")
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, shape, True)
        att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        flops = useful_attention_flops(ids, t, shape)
        ref = (torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device="cuda"))
        out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device="cuda")
        reps = 5 if t <= 262144 else 3
        label = f"m3 T={t // 1024}K"
        for i, (name, cfg) in enumerate(VARIANTS.items()):  # outputs first: each against the first variant's
            o, l_ = ref if i == 0 else (out, lse)
            o.fill_(float("nan"))
            l_.fill_(float("nan"))
            _launch_tile(*att, ids, o, l_, scale, 8, config=cfg)
            if i:
                rows.append(dict(case=label, variant=name, check=compare(out, lse, *ref)))
                print(json.dumps(rows[-1]), flush=True)
        times = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, cfg in VARIANTS.items():
                times[name].append(timed(lambda: _launch_tile(*att, ids, out, lse, scale, 8, config=cfg), reps))
        for name, ts in times.items():
            ms = sorted(ts)[len(ts) // 2]
            rows.append(dict(case=label, variant=f"whole attention: {name}", ms=round(ms, 3),
                             ms_rounds=[round(v, 3) for v in ts], tflops_useful=round(flops / ms / 1e9, 1),
                             frac_peak=round(flops / ms / 1e9 / peak, 3)))
            print(json.dumps(rows[-1]), flush=True)
        for rare_max in (2, 3):  # each kernel alone, both orders, on the same unions
            cfg = TileConfig(kernel="gluon", rare_max=rare_max).resolved(16, 128, sm90=True)
            tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
            u = tile_unions_for(cfg, ids, x["page_table"], x["cu_seqlens_q"], tiles)
            kw = dict(block_n=128, stages=2, persistent=True, q_tma=True, dynamic=True)
            qk = scale * 1.4426950408889634
            fns = {
                "tile kernel": lambda: launch_gluon_tile(*att[:3], out, lse, *att[4:], *tiles, u, qk, 16, 8, **kw),
                "tile kernel, merging": lambda: launch_gluon_tile(*att[:3], out, lse, *att[4:], *tiles, u, qk, 16, 8,
                                                                  merge=True, **kw),
                "items pass (with its bucketing), merging": lambda: launch_rare_items(
                    *att, u.rare_ids, out, lse, scale, cfg),
                "items pass (with its bucketing), round 0 writing": lambda: launch_rare_items(
                    *att, u.rare_ids, out, lse, scale, cfg, first=True),
            }
            for name, fn in fns.items():
                ms = timed(fn, reps)
                rows.append(dict(case=f"{label} rare_max {rare_max}", variant=f"alone: {name}", ms=round(ms, 3)))
                print(json.dumps(rows[-1]), flush=True)
            del u
        path.write_text(json.dumps(dict(info=info, peak=peak, rows=rows), indent=1))
        del x, ids, ref, out, lse
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
