"""Run 9: the rare pass alone, per token or bucketed into items (``rare_pass="items"``), on the rare pairs of the
real selections (M3 shape, structured inputs, regrouped tiles), each after the Gluon tile kernel filled out / LSE.
With an earlier ``gluon_tile.py`` in ``benchmarks/prefill/_before/`` (not committed) its items pass is timed too.

    python3 benchmarks/prefill/rare_items_run9.py --out DIR [--sizes 131072,1048576] [--rare-max 1,2]   # H200
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
from bench_prefill import SHAPES, make_inputs, run_info, timed  # noqa: E402
from gluon_run8 import before_module  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.gluon_tile import launch_gluon_rare  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, launch_rare_merge, tile_unions_for  # noqa: E402
from kernels.sparse_prefill.rare_items import build_rare_items  # noqa: E402

_LOG2E = 1.4426950408889634


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,1048576")
    ap.add_argument("--rare-max", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    peak, info = run_info()
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    before = before_module()
    before = before.launch_gluon_rare if before is not None else None
    rows = []
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, shape, True)
        att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device="cuda")
        for rare_max in [int(r) for r in args.rare_max.split(",")]:
            cfg = TileConfig(kernel="gluon", rare_max=rare_max).resolved(16, 128, sm90=True)
            tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
            u = tile_unions_for(cfg, ids, x["page_table"], x["cu_seqlens_q"], tiles)
            _launch_tile(*att, ids, out, lse, scale, 8, tiles=tiles, union=u, config=cfg)
            items = build_rare_items(u.rare_ids, x["page_table"], x["cu_seqlens_q"], 8)
            n_pairs = int((u.rare_ids >= 0).sum())
            n_items = int(items.round_start[-1])
            fns = {"token pass": lambda: launch_rare_merge(*att, u.rare_ids, out, lse, scale, cfg, 128),
                   "bucketing": lambda: build_rare_items(u.rare_ids, x["page_table"], x["cu_seqlens_q"], 8),
                   "items pass (merge only)": lambda: launch_gluon_rare(x["q"], x["k_cache"], x["v_cache"], out, lse,
                                                                        x["cu_seqlens_q"], x["seq_lens_kv"], items,
                                                                        scale * _LOG2E, 16, 8)}
            if before is not None:
                fns["items pass (merge only), _before/ kernel"] = lambda: before(
                    x["q"], x["k_cache"], x["v_cache"], out, lse, x["cu_seqlens_q"], x["seq_lens_kv"], items,
                    scale * _LOG2E, 16, 8)
            times = {k: [] for k in fns}
            for _ in range(args.rounds):
                for k, fn in fns.items():
                    times[k].append(timed(fn, 5))
            for k, ts in times.items():
                ms = sorted(ts)[len(ts) // 2]
                rows.append(dict(case=f"m3 T={t // 1024}K rare_max {rare_max}", variant=k, ms=round(ms, 3),
                                 ms_rounds=[round(v, 3) for v in ts], pairs=n_pairs, items=n_items,
                                 pairs_per_item=round(n_pairs / max(n_items, 1), 2),
                                 us_per_item_sm=round(ms * 1e3 * 132 / max(n_items, 1), 2) if "items" in k else None))
                print(json.dumps(rows[-1]), flush=True)
            Path(args.out, "rare_items_run9.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
        del x, ids, out, lse
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
