"""Run 9: what one item of the Gluon tile kernel costs, on synthetic unions (M3 shape, kernel alone).

Every (tile, KV head) item gets ``N`` distinct random blocks of a 64K-key prefix (all visible, no causal
step), chosen by all 8 tokens of the tile (or by a random half of them: same cost expected, the
membership bias is computed either way). Time per item and SM against ``N`` separates the per-item cost
(Q, first score MMA and softmax without overlap, last P V, epilogue) from the per-step cost.

    python3 benchmarks/prefill/items_run9.py --out DIR [--steps 0,1,2,4,8,16,24,32,64]   # H200
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
from bench_prefill import DEV, SHAPES, run_info, timed  # noqa: E402
from gluon_run8 import before_module  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.sparse_prefill.gluon_tile import launch_gluon_tile  # noqa: E402
from kernels.sparse_prefill.launch import persistent_programs  # noqa: E402
from kernels.sparse_prefill.unions import TileUnions  # noqa: E402

_LOG2E = 1.4426950408889634
OPTS = dict(block_n=128, stages=2, persistent=True, q_tma=True, dynamic=True)  # the sm_90 default


def synthetic(t: int, prefix_blocks: int, n: int, half: bool, gen: torch.Generator, same: bool = False) -> tuple:
    shape = SHAPES["m3"]
    hq, hkv, d, block = shape["hq"], shape["hkv"], shape["d"], shape["block"]
    n_pages = prefix_blocks + t // block
    page_table = torch.randperm(n_pages, device=DEV, generator=gen).to(torch.int32)[None].contiguous()
    kc = torch.randn(n_pages, hkv, block, d, device=DEV, generator=gen, dtype=torch.bfloat16)
    vc = torch.randn(n_pages, hkv, block, d, device=DEV, generator=gen, dtype=torch.bfloat16)
    q = torch.randn(t, hq, d, device=DEV, generator=gen, dtype=torch.bfloat16)
    cu = torch.tensor([0, t], dtype=torch.int32, device=DEV)
    seq = torch.tensor([prefix_blocks * block + t], dtype=torch.int32, device=DEV)
    tiles = tile_table(cu, t, 8, longest_first=False)
    n_tiles = tiles[0].shape[0]
    cap = 128
    ids = torch.rand(n_tiles, hkv, prefix_blocks, device=DEV, generator=gen).argsort(-1)[..., :cap].to(torch.int32)
    if same:  # every item the same blocks: K and V stay in L2
        ids = ids[:1, :1].expand(n_tiles, hkv, cap)
    cols = torch.arange(cap, device=DEV)
    union = torch.where(cols < n, ids, -1).contiguous()
    pages = torch.where(cols < n, page_table[0][ids.clamp(min=0).long()], 0).to(torch.int32).contiguous()
    if half:  # a random 4 of the 8 tokens chose each block
        bits = torch.rand(n_tiles, hkv, cap, 8, device=DEV, generator=gen).argsort(-1) < 4
        mask = (bits.int() << torch.arange(8, device=DEV)).sum(-1).to(torch.int32)
    else:
        mask = torch.full_like(union, 255)
    mask = torch.where(cols < n, mask, 0).contiguous()
    count = torch.full((n_tiles, hkv), n, dtype=torch.int32, device=DEV)
    count[tiles[0] < 0] = 0
    return q, kc, vc, cu, seq, tiles, TileUnions(union, pages, mask, count, None, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--steps", default="0,1,2,4,8,16,24,32,64")
    ap.add_argument("--variants", default="", help="also time: same (every item the same blocks), pingpong, "
                                                   "regs240 (comma-separated)")
    args = ap.parse_args()
    extra = [v for v in args.variants.split(",") if v]
    peak, info = run_info()
    gen = torch.Generator(device=DEV).manual_seed(0)
    shape = SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"]) * _LOG2E
    sms = persistent_programs(torch.device(DEV), 1, 1 << 30)
    rows = []
    launchers = {"run 9": launch_gluon_tile}
    before = before_module()
    if before is not None:  # the run-8 module in _before/ (not committed): timed beside
        launchers["run 8"] = before.launch_gluon_tile
    cases = [(False, k, int(n)) for k in launchers for n in args.steps.split(",")]
    cases += [(True, "run 9", int(n)) for n in args.steps.split(",")]
    cases += [(False, v, int(n)) for v in extra for n in args.steps.split(",")]
    variant_opts = dict(pingpong=dict(pingpong=True), regs240=dict(consumer_regs=240, producer_regs=24))
    for half, kernel, n in cases:
        q, kc, vc, cu, seq, tiles, u = synthetic(args.tokens, 512, n, half, gen, same=kernel == "same")
        opts = dict(OPTS, **variant_opts.get(kernel, {}))
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=DEV)
        items = int((tiles[0] >= 0).sum()) * shape["hkv"]

        def run(launch=launchers.get(kernel, launch_gluon_tile)):
            launch(q, kc, vc, out, lse, cu, seq, *tiles, u, scale, 16, 8, **opts)
        ms = timed(run, 7)
        flops = items * n * 128 * shape["block"] * shape["d"] * 4
        row = dict(kernel=kernel, steps=n, half_members=half, items=items, ms=round(ms, 4),
                   us_per_item_sm=round(ms * 1e3 * sms / items, 3),
                   tflops_executed=round(flops / ms / 1e9, 1), frac=round(flops / ms / 1e9 / peak, 3))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, kc, vc, out, lse, u
    path = Path(args.out) / "results_h200_run9_items.json"
    path.write_text(json.dumps(dict(info=info, rows=rows), indent=1))


if __name__ == "__main__":
    main()
