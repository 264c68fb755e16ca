"""Run 9: how often a union block is chosen by the tokens of one half of its 8-token tile only (M3 shape,
selections of the real fused indexer on the structured inputs, regrouped tiles, rare_max 1).

A half of the tile is one consumer warpgroup's 64 rows; a block none of whose choosers lie in a half
costs that warpgroup nothing if it skips the step. Prints the union blocks per tile, the steps each
half would run, and the rare pairs.

    python3 benchmarks/prefill/halves_run9.py --out DIR [--sizes 131072,1048576]   # H200
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import SHAPES, make_inputs  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.grouping import group_tiles  # noqa: E402
from kernels.sparse_prefill.unions import build_unions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="131072,1048576")
    args = ap.parse_args()
    rows = []
    for t in [int(s) for s in args.sizes.split(",")]:
        x = make_inputs(t, SHAPES["m3"], True)
        ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], 16)
        del x
        tiles = tile_table(torch.tensor([0, t], dtype=torch.int32, device="cuda"), t, 8, longest_first=False)
        cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
        pt = torch.arange(t // 128, dtype=torch.int32, device="cuda")[None]
        for rare_max in (1, 2):
            tokmap = group_tiles(ids, cu, *tiles, 8)
            u = build_unions(ids, pt, cu, *tiles, 8, rare_max=rare_max, tokmap=tokmap)
            valid = tiles[0] >= 0
            cols = torch.arange(u.union.shape[-1], device="cuda")
            live = cols < u.count[..., None]
            m = u.token_mask
            lo = ((m & 0x0F) != 0) & live
            hi = ((m & 0xF0) != 0) & live
            items = float(valid.sum()) * u.count.shape[1]
            union = float(u.count[valid].sum()) / items
            steps_lo = float(lo[valid].sum()) / items
            steps_hi = float(hi[valid].sum()) / items
            both = float((lo & hi)[valid].sum()) / items
            rare = float((u.rare_ids >= 0).sum()) / (t * u.count.shape[1])
            popc = sum(((m >> b) & 1) for b in range(8))
            members = float(torch.where(live, popc, 0)[valid].sum()) / items
            row = dict(tokens=t, rare_max=rare_max, union_per_tile=round(union, 3), steps_low_half=round(steps_lo, 3),
                       steps_high_half=round(steps_hi, 3), blocks_in_both_halves=round(both, 3),
                       tokens_per_union_block=round(members / union, 3),
                       max_half_steps_over_union=round(float(torch.maximum(lo.sum(-1), hi.sum(-1))[valid].sum())
                                                       / items / union, 3),
                       rare_pairs_per_token_head=round(rare, 3))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del ids
    Path(args.out, "results_h200_run9_halves.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
