"""Run 8: the warp-specialised Gluon tile kernel against the Triton tile kernel, each alone on the same
unions (M3 shape, selections of the real fused indexer, regrouped tiles, rare_max 1), outputs compared.

    python3 benchmarks/prefill/gluon_run8.py --out DIR [--sizes 65536,131072] [--rounds 2] [--table run9]   # H200
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
from bench_prefill import DEV, SHAPES, make_inputs, run_info, timed  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.gluon_tile import launch_gluon_tile  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile  # noqa: E402
from kernels.sparse_prefill.unions import TileUnions, build_unions  # noqa: E402

_LOG2E = 1.4426950408889634
# label -> launch_gluon_tile options (the table of the last call; RESULTS.md run 8). The earlier calls
# also timed: a consumer that waits for each step's P V before its next score MMA ("plain"), 64-key
# steps, 3 stages (results_h200_run8_gluon1.json); persistent vs one program per item, 64-key steps
# with 4 stages, 240 consumer registers (gluon2.json); ping-pong alone and with Q by TMA (gluon3.json).
GLUON = {
    "gluon (BN128 st2 persistent)": dict(block_n=128, stages=2, persistent=True),
    "gluon + Q by TMA": dict(block_n=128, stages=2, persistent=True, q_tma=True),
    "gluon + Q by TMA, per item": dict(block_n=128, stages=2, q_tma=True),
    "gluon + Q by TMA, dynamic": dict(block_n=128, stages=2, persistent=True, q_tma=True, dynamic=True),
    "gluon + Q by TMA, dynamic, ping-pong": dict(block_n=128, stages=2, persistent=True, q_tma=True, dynamic=True,
                                                 pingpong=True),
}

# run 9 (RESULTS.md session 7): the item slot in shared memory and the output stored by TMA; with
# ``--table run9`` and the run-8 module copied to ``benchmarks/prefill/_before/gluon_tile.py`` (not
# committed) the run-8 kernel is timed beside it
DEFAULT = dict(block_n=128, stages=2, persistent=True, q_tma=True, dynamic=True)
RUN9 = {"run 9 default (slot in smem; out by TMA)": DEFAULT, "run 9, out by the consumers": dict(DEFAULT, o_tma=False),
        "union sorted by block, ascending": dict(DEFAULT, sort="asc"),
        "union sorted by block, descending": dict(DEFAULT, sort="desc"),
        "run 9 + ping-pong": dict(DEFAULT, pingpong=True),
        "run 9 + 240 / 24 registers": dict(DEFAULT, consumer_regs=240, producer_regs=24)}
# call 3 also timed items in runs of 32 / 256 tiles of one KV head (a producer option since removed:
# no gain, results_h200_run9_gluon2.json)


def sorted_union(u: TileUnions, descending: bool) -> TileUnions:
    """The same unions with each (tile, KV head)'s blocks in block order (neighbouring tiles then read
    the blocks they share at about the same step)."""
    key = torch.where(u.union >= 0, u.union, -1 if descending else 2 ** 31 - 1)
    order = torch.sort(key, dim=-1, descending=descending, stable=True).indices
    return TileUnions(*(x.gather(-1, order).contiguous() for x in (u.union, u.pages, u.token_mask)), u.count,
                      None, u.tokmap)


def before_module():
    """An earlier ``gluon_tile`` module where ``_before/gluon_tile.py`` (not committed) holds one, else None."""
    import importlib.util
    path = Path(__file__).parent / "_before" / "gluon_tile.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("gluon_tile_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="65536,131072")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--only", default="", help="comma-separated labels of GLUON to run (default all)")
    ap.add_argument("--table", choices=("run8", "run9"), default="run8")
    args = ap.parse_args()
    table = dict(GLUON) if args.table == "run8" else dict(RUN9)
    before = before_module() if args.table == "run9" else None
    if before is not None:
        table["run 8 kernel (slot in global memory)"] = dict(DEFAULT, launch=before.launch_gluon_tile)
    deadline = time.time() + args.budget_s
    peak, info = run_info()
    rows = []
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    variants = {k: v for k, v in table.items() if not args.only or k in args.only.split(",")}
    for t in [int(s) for s in args.sizes.split(",")]:
        if time.time() > deadline:
            break
        x = make_inputs(t, shape, True)
        att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
        tokmap = group_tiles(ids, x["cu_seqlens_q"], *tiles, 8)
        u = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, 8, rare_max=1, tokmap=tokmap)
        tile_only = TileUnions(u.union, u.pages, u.token_mask, u.count, None, tokmap)
        n_union = float(u.count[tiles[0] >= 0].sum())
        exec_flops = n_union * 128 * shape["block"] * shape["d"] * 4
        cfg = TileConfig().resolved(16, 128)
        ref_out, ref_lse = torch.empty_like(x["q"]), torch.full((t, shape["hq"]), float("-inf"), device=DEV)
        _launch_tile(*att, ids, ref_out, ref_lse, scale, 8, tiles=tiles, union=tile_only, config=cfg)
        fns = {"triton tile kernel (default)": lambda: _launch_tile(*att, ids, ref_out, ref_lse, scale, 8, tiles=tiles,
                                                                    union=tile_only, config=cfg)}
        for label, opts in variants.items():
            out, lse = torch.full_like(x["q"], float("nan")), torch.full((t, shape["hq"]), float("nan"), device=DEV)

            opts = dict(opts)
            launch = opts.pop("launch", launch_gluon_tile)
            order = opts.pop("sort", None)
            unions = tile_only if order is None else sorted_union(tile_only, order == "desc")

            def run(out=out, lse=lse, opts=opts, launch=launch, unions=unions):
                launch(x["q"], x["k_cache"], x["v_cache"], out, lse, x["cu_seqlens_q"], x["seq_lens_kv"], *tiles,
                       unions, scale * _LOG2E, 16, 8, **opts)
            try:
                run()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                print(json.dumps(dict(case=f"T={t}", variant=label, error=repr(e)[:400])), flush=True)
                continue
            sub = slice(None, None, 16)  # every 16th token (full fp32 copies at 1M would not fit)
            touched = ref_lse[sub] > float("-inf")
            o, r = out[sub].float()[touched], ref_out[sub].float()[touched]
            rel = float((o - r).norm() / r.norm())
            lse_err = float((lse[sub] - ref_lse[sub])[touched].abs().max())
            ok = rel < 4e-3 and lse_err < 1e-3 and not bool(torch.isnan(o).any())
            del o, r
            print(json.dumps(dict(case=f"T={t}", variant=label, rel_err=rel, lse_max_err=lse_err, ok=ok)), flush=True)
            if ok:
                fns[label] = run
        times = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                times[k].append(timed(fn, 5))
        for k, ts in times.items():
            ms = sorted(ts)[len(ts) // 2]
            tf = exec_flops / ms / 1e9
            rows.append(dict(case=f"m3 T={t // 1024}K", variant=k, ms=round(ms, 3), ms_rounds=[round(v, 3) for v in ts],
                             tflops_executed=round(tf, 1), frac_peak=round(tf / peak, 3),
                             union_per_tile=round(n_union / int((tiles[0] >= 0).sum()) / 4, 2)))
            print(json.dumps(rows[-1]), flush=True)
        Path(args.out, f"gluon_{args.table}.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
        torch.cuda.empty_cache()
    for r in rows:
        print(f"{r['case']:<12} {r['variant']:<32} {r['ms']:>8.3f} ms {r['tflops_executed']:>6} TFLOP/s executed "
              f"({r['frac_peak']}) rounds {r['ms_rounds']}")


if __name__ == "__main__":
    main()
