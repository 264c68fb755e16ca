"""Runs 6 to 9: where the tile design's time goes (union build, tile kernel, rare-block merge pass) and the tile
loop's raw rate on shared selections (every token of a 128-token window given its first token's
blocks, so every union block is used by all 8 tokens: the ceiling that grouping tokens can reach).

    python3 benchmarks/prefill/breakdown_run6.py --out DIR [--sizes 65536,131072]   # H200
    python3 benchmarks/prefill/breakdown_run6.py --out DIR --set run7 --selections real --sizes 65536,131072,1048576
    python3 benchmarks/prefill/breakdown_run6.py --out DIR --set run8 --selections real --sizes 131072,1048576
    python3 benchmarks/prefill/breakdown_run6.py --out DIR --set run9 --selections real --sizes 131072,1048576
    python3 benchmarks/prefill/breakdown_run6.py --dry-cpu --out /tmp/x            # tiny
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
from bench_prefill import DEV, DRY, SHAPES, make_inputs, run_info, timed, useful_attention_flops  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, launch_rare_items, launch_rare_merge  # noqa: E402
from kernels.sparse_prefill.rare_items import build_rare_items  # noqa: E402
from kernels.sparse_prefill.unions import TileUnions, build_unions  # noqa: E402

RUN6 = {k: v.resolved(16, 128) for k, v in {
    "run-5 default (BN 128, 3 stages, rare_max 2)": TileConfig(tile_q=8, rare_max=2, block_n=0, maxnreg=0, group=False),
    "BN 64, 2 stages, maxnreg 128, rare_max 1": TileConfig(tile_q=8, rare_max=1, block_n=64, num_stages=2, maxnreg=128,
                                                           group=False),
    "BN 64, 2 stages, maxnreg 128, rare_max 2": TileConfig(tile_q=8, rare_max=2, block_n=64, num_stages=2, maxnreg=128,
                                                           group=False),
    "run-6 default: the same, rare_max 1, regrouped tiles": TileConfig(),
}.items()}
RUN7 = {k: v.resolved(16, 128) for k, v in {  # run 7: the tile kernel's K / V loads and program order
    "run-6 default": TileConfig(),
    "TMA descriptors": TileConfig(tma=True),
    "head-major programs": TileConfig(head_major=True),
    "TMA + head-major": TileConfig(tma=True, head_major=True),
}.items()}
RUN8 = {k: v.resolved(16, 128) for k, v in {  # run 8: the warp-specialised Gluon tile kernel
    "run-7 default (Triton tile kernel)": TileConfig(kernel="triton"),
    "run-8 default on sm_90 (Gluon tile kernel)": TileConfig(kernel="gluon"),
}.items()}

# run 9: the rare pass, per token (the run-7 default: 2 warps, 64-key steps, 2 stages; call 7 also timed 1 stage,
# 32-key steps, 1 warp: results_h200_run9_breakdown_rare_opts.json; call 6 the items in the order of their first
# rare block, a launch option since removed: results_h200_run9_breakdown_rare_order.json) or bucketed into items
# that share K / V (rare_pass "items", the Gluon kernel's rare mode), at rare_max 1 to 3
RUN9 = {k: v.resolved(16, 128, sm90=True) for k, v in {
    "run-9 default (token pass, rare_max 1)": TileConfig(kernel="gluon"),
    "items pass, rare_max 1": TileConfig(kernel="gluon", rare_pass="items"),
    "token pass, rare_max 2": TileConfig(kernel="gluon", rare_max=2),
    "items pass, rare_max 2": TileConfig(kernel="gluon", rare_pass="items", rare_max=2),
    "items pass, rare_max 3": TileConfig(kernel="gluon", rare_pass="items", rare_max=3),
}.items()}
RUN9_ITEMS = {k: v for k, v in RUN9.items() if "items" in k}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="65536,131072")
    ap.add_argument("--dry-cpu", action="store_true")
    ap.add_argument("--set", default="run6", choices=("run6", "run7", "run8", "run9", "run9_items"))
    ap.add_argument("--selections", default="real,shared")
    args = ap.parse_args()
    configs = dict(run6=RUN6, run7=RUN7, run8=RUN8, run9=RUN9, run9_items=RUN9_ITEMS)[args.set]
    peak, info = run_info()
    rows = []

    def add(case, stage, ms, flops=None, note=""):
        tf = flops / ms / 1e9 if flops else None
        rows.append(dict(case=case, stage=stage, ms=round(ms, 3), tflops=round(tf, 1) if tf else None,
                         frac_peak=round(tf / peak, 3) if tf else None, note=note))
        print(json.dumps(rows[-1]), flush=True)

    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    for t in ([384] if DRY else [int(s) for s in args.sizes.split(",")]):
        x = make_inputs(t, shape, True)
        att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
        real = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        win = torch.arange(t, device=DEV) // shape["block"] * shape["block"]
        shared = real[win].contiguous()  # each token gets its window's first token's blocks (own block shared)
        out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=DEV)
        for sel_name, ids in (("real", real), ("shared", shared)):
            if sel_name not in args.selections.split(","):
                continue
            flops = useful_attention_flops(ids, t, shape)
            case = f"m3 T={t // 1024}K {sel_name} selections"
            for label, cfg in configs.items():
                tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
                tokmap = group_tiles(ids, x["cu_seqlens_q"], *tiles, 8) if cfg.group else None
                u = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, 8, rare_max=cfg.rare_max,
                                 tokmap=tokmap)
                tile_only = TileUnions(u.union, u.pages, u.token_mask, u.count, None, tokmap)
                t_g = timed(lambda: group_tiles(ids, x["cu_seqlens_q"], *tiles, 8), 5) if cfg.group else 0.0
                n_rare = int((u.rare_ids >= 0).sum()) if u.rare_ids is not None else 0
                t_u = timed(lambda: build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, 8,
                                                 rare_max=cfg.rare_max, tokmap=tokmap), 5)
                t_tile = timed(lambda: _launch_tile(*att, ids, out, lse, scale, 8, tiles=tiles, union=tile_only,
                                                    config=cfg), 5)
                if cfg.rare_pass == "items":
                    t_rare = (timed(lambda: launch_rare_items(*att, u.rare_ids, out, lse, scale, cfg), 5) if n_rare
                              else 0.0)
                    t_bucket = timed(lambda: build_rare_items(u.rare_ids, x["page_table"], x["cu_seqlens_q"], 8), 5)
                else:
                    t_rare = timed(lambda: launch_rare_merge(*att, u.rare_ids, out, lse, scale, cfg, 128),
                                   5) if n_rare else 0.0
                steps = int(u.count[tiles[0] >= 0].sum()) * (shape["block"] // (cfg.block_n or shape["block"]))
                exec_tile = float(u.count[tiles[0] >= 0].sum()) * 128 * shape["block"] * shape["d"] * 4
                mean_union = float(u.count[tiles[0] >= 0].float().mean())
                if cfg.group:
                    add(case, f"{label}: regrouping", t_g)
                add(case, f"{label}: union build", t_u)
                add(case, f"{label}: tile kernel only", t_tile, exec_tile,
                    f"TFLOP/s = executed (all 128 rows x union blocks); {steps} loop steps, "
                    f"{mean_union:.2f} union blocks per tile")
                if n_rare and cfg.rare_pass == "items":
                    add(case, f"{label}: bucketing (in the rare pass below)", t_bucket)
                if n_rare:
                    add(case, f"{label}: rare merge pass only", t_rare, None,
                        f"{n_rare} rare pairs, {n_rare / max(t_rare, 1e-9) / 1e3:.1f} M pairs/s, "
                        f"{n_rare * 2 * shape['block'] * shape['d'] * 2 / t_rare / 1e9:.2f} TB/s of K/V read")
                add(case, f"{label}: sum", t_g + t_u + t_tile + t_rare, flops, "TFLOP/s useful")
        del x, real, shared, out, lse
        if not DRY:
            torch.cuda.empty_cache()
        Path(args.out, f"breakdown_{args.set}.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    for r in rows:
        print(f"{r['case']:<26} {r['stage']:<62} {r['ms']:>8.3f} {r['tflops'] or '':>6} {r['note']}")


if __name__ == "__main__":
    main()
