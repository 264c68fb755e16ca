"""Run 10: the Gluon tile kernel and its items pass (rare mode), each alone on the unions and rare items of the real
selections (M3 shape, structured inputs, regrouped tiles, rare_max 2), against the module in
``benchmarks/prefill/_before/gluon_tile.py`` (not committed: copy the kernel of the commit to compare with there),
outputs compared (after one tile pass and one items pass each).

Calls of run 10 (RESULTS.md): 1 = the latency diet (``run10_patches/latency_diet.patch``), 5 = the step keys and
epilogue tokens loaded ahead (in ``run10_patches/rare_first_and_loads_ahead.patch``), 9 / 10 = the rare items
pipelined with two Q buffers (output through the Q buffer; output through the earlier-output buffer:
``run10_patches/rare_pipelined_consumer.patch``), 11 = the kept version (three Q buffers, commit 343233a);
``_before/`` held the kernel of commit 7a3e731 each time.

    python3 benchmarks/prefill/gluon_vs_before_run10.py --out DIR [--sizes 131072,1048576] [--rounds 3]   # H200
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
from kernels.sparse_prefill.gluon_tile import launch_gluon_rare, launch_gluon_tile  # noqa: E402
from kernels.sparse_prefill.launch import tile_unions_for  # noqa: E402
from kernels.sparse_prefill.rare_items import build_rare_items  # noqa: E402

_LOG2E = 1.4426950408889634
_TILE = dict(block_n=128, stages=2, persistent=True, q_tma=True, dynamic=True)  # the default launch (RESULTS.md)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, a slice of tokens at a time (two 1M outputs are 32 GB)."""
    step = 65536
    return max(float((a[i:i + step].float() - b[i:i + step].float()).abs().max()) for i in range(0, a.shape[0], step))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,1048576")
    ap.add_argument("--rare-max", default="2")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    peak, info = run_info()
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"]) * _LOG2E
    before = before_module()
    rows = []
    path = Path(args.out, "gluon_vs_before_run10.json")
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, shape, True)
        q, kc, vc, cuq, seq = x["q"], x["k_cache"], x["v_cache"], x["cu_seqlens_q"], x["seq_lens_kv"]
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], cuq, seq, 16)
        outs = {name: (torch.empty_like(q), torch.empty(t, shape["hq"], device="cuda")) for name in ("new", "old")}
        for rare_max in [int(r) for r in args.rare_max.split(",")]:
            cfg = TileConfig(kernel="gluon", rare_max=rare_max).resolved(16, 128, sm90=True)
            tiles = tile_table(cuq, t, 8, longest_first=False)
            u = tile_unions_for(cfg, ids, x["page_table"], cuq, tiles)
            items = build_rare_items(u.rare_ids, x["page_table"], cuq, 8)
            n_items = int(items.round_start[-1])
            steps = int(u.count.sum())

            def tile(mod, name):
                o, l = outs[name]
                return lambda: mod.launch_gluon_tile(q, kc, vc, o, l, cuq, seq, *tiles, u, scale, 16, 8, **_TILE)

            def rare(mod, name):
                o, l = outs[name]
                return lambda: mod.launch_gluon_rare(q, kc, vc, o, l, cuq, seq, items, scale, 16, 8)

            new = sys.modules[launch_gluon_tile.__module__]
            fns = {"tile kernel": tile(new, "new"), "items pass": rare(new, "new")}
            if before is not None and rare_max == 2:
                fns["tile kernel, before"] = tile(before, "old")
                fns["items pass, before"] = rare(before, "old")
                for name, mod in (("new", new), ("old", before)):  # one pass each, then compared
                    tile(mod, name)()
                    rare(mod, name)()
                torch.cuda.synchronize()
                check = dict(out=_diff(outs["new"][0], outs["old"][0]), lse=_diff(outs["new"][1], outs["old"][1]))
                print(json.dumps(dict(case=t, check=check)), flush=True)
                rows.append(dict(case=f"m3 T={t // 1024}K", check_new_vs_before=check))
            times = {k: [] for k in fns}
            for _ in range(args.rounds):
                for k, fn in fns.items():
                    times[k].append(timed(fn, 5 if t <= 262144 else 3))
            for k, ts in times.items():
                ms = sorted(ts)[len(ts) // 2]
                per = n_items if "items" in k else tiles[0].shape[0] * shape["hkv"]
                rows.append(dict(case=f"m3 T={t // 1024}K rare_max {rare_max}", variant=k, ms=round(ms, 3),
                                 ms_rounds=[round(v, 3) for v in ts], items=per, union_steps=steps,
                                 rare_items=n_items, us_per_item_sm=round(ms * 1e3 * 132 / max(per, 1), 3)))
                print(json.dumps(rows[-1]), flush=True)
            path.write_text(json.dumps(dict(info=info, peak=peak, rows=rows), indent=1))
            del u, items
        del x, ids, outs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
