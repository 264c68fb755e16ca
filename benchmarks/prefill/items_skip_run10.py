"""Run 10: where the items pass's time goes. The Gluon kernel's rare mode with parts of its work left out (a
diagnostic copy of ``gluon_tile.py`` in ``benchmarks/prefill/_exp/`` made by ``run10_patches/items_skip_knobs.patch``,
not committed as a module): ``skip`` bit 1 = no Q copy, 2 = no copy of the earlier output, 4 = no output store by
TMA, 8 = no K / V copy (the results are wrong; only the time is read). Rare items of the real selections (M3 shape,
structured inputs, regrouped tiles, rare_max 2), each round after the tile kernel.

    mkdir -p benchmarks/prefill/_exp
    git show 7a3e731:kernels/sparse_prefill/gluon_tile.py > benchmarks/prefill/_exp/gluon_tile.py
    (cd benchmarks/prefill/_exp && patch -p3 < ../run10_patches/items_skip_knobs.patch)
    python3 benchmarks/prefill/items_skip_run10.py --out DIR [--sizes 131072,1048576]   # H200
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import SHAPES, make_inputs, run_info, timed  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, tile_unions_for  # noqa: E402
from kernels.sparse_prefill.rare_items import build_rare_items  # noqa: E402

SKIPS = {"all work": 0, "no Q copy": 1, "no earlier-output copy": 2, "no output store": 4, "no K / V copy": 8,
         "no Q / earlier-output copies, no store": 7, "no copies, no store (the math and hand-offs only)": 15}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,1048576")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("gluon_tile_exp", Path(__file__).parent / "_exp" / "gluon_tile.py")
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    peak, info = run_info()
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    rows = []
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, shape, True)
        att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device="cuda")
        cfg = TileConfig(kernel="gluon", rare_max=2).resolved(16, 128, sm90=True)
        tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
        u = tile_unions_for(cfg, ids, x["page_table"], x["cu_seqlens_q"], tiles)
        _launch_tile(*att, ids, out, lse, scale, 8, tiles=tiles, union=u, config=cfg)
        items = build_rare_items(u.rare_ids, x["page_table"], x["cu_seqlens_q"], 8)
        n_items = int(items.round_start[-1])
        times = {k: [] for k in SKIPS}
        for _ in range(args.rounds):
            for k, skip in SKIPS.items():
                times[k].append(timed(lambda: exp.launch_gluon_rare(
                    x["q"], x["k_cache"], x["v_cache"], out, lse, x["cu_seqlens_q"], x["seq_lens_kv"], items,
                    scale * 1.4426950408889634, 16, 8, skip=skip), 5 if t <= 262144 else 3))
        for k, ts in times.items():
            ms = sorted(ts)[len(ts) // 2]
            rows.append(dict(case=f"m3 T={t // 1024}K rare_max 2", variant=k, ms=round(ms, 3),
                             ms_rounds=[round(v, 3) for v in ts], items=n_items,
                             us_per_item_sm=round(ms * 1e3 * 132 / max(n_items, 1), 3)))
            print(json.dumps(rows[-1]), flush=True)
        Path(args.out, "items_skip_run10.json").write_text(json.dumps(dict(info=info, peak=peak, rows=rows), indent=1))
        del x, ids, out, lse, u, items
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
