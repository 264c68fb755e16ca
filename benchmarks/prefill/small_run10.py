"""Run 10: the small kernels before the tile kernel, each alone on the real selections (M3 shape, structured
inputs): the regrouping with the hash bits counted by the GPU's ``popc`` instruction or in SWAR (its output
compared: the same tiles), at 1, 2 and 4 warps; the union build; the rare pairs' bucketing. ``popc`` was not
kept (no gain, RESULTS.md run 10): apply ``run10_patches/popc_regrouping.patch`` first (``git apply``; call 6).

    python3 benchmarks/prefill/small_run10.py --out DIR [--sizes 131072,1048576]   # H200
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import SHAPES, make_inputs, run_info, timed  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels.sparse_prefill.launch import tile_unions_for  # noqa: E402
from kernels.sparse_prefill.rare_items import build_rare_items  # noqa: E402
from kernels.sparse_prefill.unions import build_unions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,1048576")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    peak, info = run_info()
    shape = SHAPES["m3"]
    rows = []
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, shape, True)
        cuq, pt = x["cu_seqlens_q"], x["page_table"]
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], pt, cuq, x["seq_lens_kv"], 16)
        tiles = tile_table(cuq, t, 8, longest_first=False)
        ref = group_tiles(ids, cuq, *tiles, 8, popc=False)
        for warps in (1, 2, 4):
            same = bool(torch.equal(group_tiles(ids, cuq, *tiles, 8, num_warps=warps, popc=True), ref))
            rows.append(dict(case=f"m3 T={t // 1024}K", variant=f"regrouping popc, {warps} warps: same tiles as SWAR",
                             equal=same))
            print(json.dumps(rows[-1]), flush=True)
        cfg = TileConfig(kernel="gluon").resolved(16, 128, sm90=True)
        u = tile_unions_for(cfg, ids, pt, cuq, tiles)
        fns = {"regrouping, SWAR popcount, 2 warps (run 9)": lambda: group_tiles(ids, cuq, *tiles, 8, popc=False)}
        for warps in (1, 2, 4):
            fns[f"regrouping, popc, {warps} warps"] = (
                lambda w=warps: group_tiles(ids, cuq, *tiles, 8, num_warps=w, popc=True))
        fns["union build (rare_max 2)"] = lambda: build_unions(ids, pt, cuq, *tiles, 8, rare_max=2, tokmap=u.tokmap)
        fns["bucketing of the rare pairs"] = lambda: build_rare_items(u.rare_ids, pt, cuq, 8)
        times = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                times[k].append(timed(fn, 5))
        for k, ts in times.items():
            rows.append(dict(case=f"m3 T={t // 1024}K", variant=k, ms=round(sorted(ts)[len(ts) // 2], 3),
                             ms_rounds=[round(v, 3) for v in ts]))
            print(json.dumps(rows[-1]), flush=True)
        Path(args.out, "small_run10.json").write_text(json.dumps(dict(info=info, peak=peak, rows=rows), indent=1))
        del x, ids, u
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
