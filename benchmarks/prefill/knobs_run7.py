"""Run 7: launch knobs of the two small kernels around the tile loop, each timed alone on the selections
of the real indexer: the union build's warps, and the per-token rare merge pass's warps, pipeline
stages and keys per step (each variant's result compared with the default's first).

    python3 benchmarks/prefill/knobs_run7.py --out DIR [--sizes 65536,131072,1048576]   # H200
    python3 benchmarks/prefill/knobs_run7.py --dry-cpu --out /tmp/x                     # tiny
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
from bench_prefill import DEV, DRY, SHAPES, make_inputs, run_info, timed  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, _launch_token  # noqa: E402
from kernels.sparse_prefill.unions import TileUnions, build_unions  # noqa: E402

RARE_KNOBS = [  # (warps, stages, keys per step; 0 = whole block): the first is the default
    (4, 2, 0), (4, 1, 0), (4, 3, 0), (8, 2, 0), (4, 2, 64), (4, 3, 64), (8, 2, 64), (2, 2, 64), (8, 3, 64),
    (2, 3, 64), (2, 1, 64), (1, 2, 64), (2, 2, 32), (1, 2, 32), (2, 3, 32)]


def max_abs_diff(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 16) -> float:
    """max |a - b| in fp32, a chunk of rows at a time (the 1M outputs are 16 GiB in bf16)."""
    return max((a[i:i + chunk].float() - b[i:i + chunk].float()).abs().max().item()
               for i in range(0, a.shape[0], chunk))
UNION_WARPS = [4, 1, 2, 8]


def run_size(t: int, add) -> None:
    """Both knob sets at ``t`` tokens (M3 shape, the default tile config around them)."""
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"])
    cfg = TileConfig().resolved(16, 128)
    case = f"m3 T={t // 1024}K real selections"
    x = make_inputs(t, shape, True)
    att = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
    tiles = tile_table(x["cu_seqlens_q"], t, 8, longest_first=False)
    tokmap = group_tiles(ids, x["cu_seqlens_q"], *tiles, 8)
    ref = None
    for w in UNION_WARPS:
        u = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, 8, rare_max=cfg.rare_max,
                         tokmap=tokmap, num_warps=w)
        got = (u.union, u.pages, u.token_mask, u.count, u.rare_ids)
        ref = ref or got
        same = all(torch.equal(a, b) for a, b in zip(got, ref))
        ms = timed(lambda: build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, 8,
                                        rare_max=cfg.rare_max, tokmap=tokmap, num_warps=w), 10)
        add(case, f"union build, {w} warps", ms, f"same as 4 warps: {same}")
    u = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, 8, rare_max=cfg.rare_max, tokmap=tokmap)
    out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=DEV)
    _launch_tile(*att, ids, out, lse, scale, 8, tiles=tiles, config=cfg,
                 union=TileUnions(u.union, u.pages, u.token_mask, u.count, None, tokmap))
    out0, lse0 = out.clone(), lse.clone()
    n_rare = int((u.rare_ids >= 0).sum())
    base = None
    for warps, stages, bn in RARE_KNOBS:
        out.copy_(out0)
        lse.copy_(lse0)
        _launch_token(*att, u.rare_ids, out, lse, scale, merge=True, num_stages=stages, num_warps=warps,
                      block_n=bn)
        base = base or (out.clone(), lse.clone())
        diff = max_abs_diff(out, base[0])
        dl = max_abs_diff(lse, base[1])
        ms = timed(lambda: _launch_token(*att, u.rare_ids, out, lse, scale, merge=True, num_stages=stages,
                                         num_warps=warps, block_n=bn), 10)
        add(case, f"rare merge pass, {warps} warps, {stages} stages, {bn or shape['block']}-key steps", ms,
            f"{n_rare} pairs, {n_rare * 2 * shape['block'] * shape['d'] * 2 / ms / 1e9:.2f} TB/s of K/V; "
            f"max|diff vs default| out {diff:.3g} lse {dl:.2g}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="65536,131072,1048576")
    ap.add_argument("--dry-cpu", action="store_true")
    args = ap.parse_args()
    peak, info = run_info()
    rows = []

    def add(case, stage, ms, note=""):
        rows.append(dict(case=case, stage=stage, ms=round(ms, 3), note=note))
        print(json.dumps(rows[-1]), flush=True)

    for t in ([384] if DRY else [int(s) for s in args.sizes.split(",")]):
        run_size(t, add)
        if not DRY:
            torch.cuda.empty_cache()
        Path(args.out, "knobs_run7.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    for r in rows:
        print(f"{r['case']:<26} {r['stage']:<56} {r['ms']:>8.3f} {r['note']}")


if __name__ == "__main__":
    main()
