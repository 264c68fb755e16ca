"""Run 8: does a finer hash or a wider window regroup tokens into smaller unions at 1M (M3 shape,
selections of the real fused indexer, Gluon tile kernel)? Per variant: union blocks per tile, rare
pairs, the regrouping kernel alone, and the whole sparse attention (regrouping, union build, tile
kernel, rare pass), its output compared with the default variant's.

    python3 benchmarks/prefill/grouping_run8.py --out DIR [--sizes 131072,1048576]   # H200
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import SHAPES, make_inputs, run_info, timed, useful_attention_flops  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, tile_unions_for  # noqa: E402

VARIANTS = {  # label -> (hash words, tiles per window)
    "default (4 words, 16 tiles)": (4, 16),
    "8 words": (8, 16),
    "16 words": (16, 16),
    "32-tile windows": (4, 32),
    "8 words, 32-tile windows": (8, 32),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,1048576")
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    peak, info = run_info()
    rows = []
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, shape, True)
        att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        flops = useful_attention_flops(ids, t, shape)
        tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
        base = None
        for label, (words, window) in VARIANTS.items():
            if time.time() > deadline:
                break
            cfg = TileConfig(kernel="gluon", group_words=words, group_window=window).resolved(16, 128)
            u = tile_unions_for(cfg, ids, x["page_table"], x["cu_seqlens_q"], tiles)
            valid = tiles[0] >= 0
            union = float(u.count[valid].float().mean())
            rare = int((u.rare_ids >= 0).sum())
            out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=x["q"].device)

            def fn(cfg=cfg, out=out, lse=lse):
                un = tile_unions_for(cfg, ids, x["page_table"], x["cu_seqlens_q"], tiles)
                _launch_tile(*att, ids, out, lse, scale, 8, tiles=tiles, union=un, config=cfg)
            fn()
            sub = slice(None, None, 16)
            if base is None:
                base = (out[sub].float(), lse[sub].clone())
            rel = float((out[sub].float() - base[0]).norm() / base[0].norm())
            lse_err = float((lse[sub] - base[1]).abs().max())
            t_group = timed(lambda: group_tiles(ids, x["cu_seqlens_q"], *tiles, 8, words=words, window=window), 5)
            ms = timed(fn, 5)
            rows.append(dict(case=f"m3 T={t // 1024}K", variant=label, union_per_tile=round(union, 2),
                             rare_pairs=rare, regroup_ms=round(t_group, 3), attention_ms=round(ms, 3),
                             tflops_useful=round(flops / ms / 1e9, 1), frac_peak=round(flops / ms / 1e9 / peak, 3),
                             rel_err_vs_default=rel, lse_err_vs_default=lse_err))
            print(json.dumps(rows[-1]), flush=True)
            Path(args.out, "grouping_run8.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
        base = None
        torch.cuda.empty_cache()
    for r in rows:
        print(f"{r['case']:<11} {r['variant']:<28} union {r['union_per_tile']:>6} rare {r['rare_pairs']:>8} "
              f"regroup {r['regroup_ms']:>7.3f} attention {r['attention_ms']:>8.3f} ms ({r['tflops_useful']} useful) "
              f"err {r['rel_err_vs_default']:.1e}")


if __name__ == "__main__":
    main()
