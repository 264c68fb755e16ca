"""Run 10: what bounds the items pass. Prints how the rare items fall into buckets (items that share one block's
K / V) and runs the tile kernel and the items pass once each, for Nsight Compute to read their counters:

    ncu --clock-control none -k regex:_gluon_tile_kernel --launch-count 3 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        python3 benchmarks/prefill/ncu_items_run10.py [--size 131072]   # H200
    ncu --clock-control none -k regex:_gluon_tile_kernel --launch-skip S --launch-count 1 --section SourceCounters \\
        --section WarpStateStats --page source --print-source sass --csv python3 ... > src.csv   # S: 0 tile, 1 rare
    python3 benchmarks/prefill/ncu_items_run10.py --summarize src.csv   # stall reasons per warp partition
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import SHAPES, make_inputs  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402
from kernels.sparse_prefill.gluon_tile import launch_gluon_rare, launch_gluon_tile  # noqa: E402
from kernels.sparse_prefill.launch import tile_unions_for  # noqa: E402
from kernels.sparse_prefill.rare_items import build_rare_items  # noqa: E402


def summarize(path: str) -> dict:
    """Warp-stall samples of an ``ncu --page source --csv`` export, per code region between the
    ``setmaxnreg`` / ``EXIT`` instructions (the warp partitions: consumer 0, producer, the idle warps,
    consumer 1): each region's share of the samples and its six largest stall reasons."""
    import csv

    lines = open(path).read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    rows = list(csv.reader(lines[start:]))
    hdr, data = rows[0], rows[1:]
    col = hdr.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[col]) for r in data) or 1
    marks = [i for i, r in enumerate(data) if "USETMAXREG" in r[1] or "EXIT" in r[1]]
    out = []
    for a, b in zip([0] + [m + 1 for m in marks], [m + 1 for m in marks] + [len(data)]):
        samples = sum(int(data[i][col]) for i in range(a, b))
        if samples * 200 < total:  # under 0.5%
            continue
        by = {hdr[c][6:]: sum(int(data[i][c] or 0) for i in range(a, b)) for c in reasons}
        top = sorted(by.items(), key=lambda kv: -kv[1])[:6]
        out.append(dict(sass_lines=[a, b], share=round(samples / total, 3),
                        stalls={k: round(v / total, 3) for k, v in top}))
    return dict(file=path, samples=total, regions=out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=131072)
    ap.add_argument("--rare-max", type=int, default=2)
    ap.add_argument("--summarize", nargs="*", help="ncu source-page CSV exports to summarise (no GPU run)")
    args = ap.parse_args()
    if args.summarize:
        print(json.dumps([summarize(p) for p in args.summarize], indent=1))
        return
    t, shape = args.size, SHAPES["m3"]
    scale = 1 / math.sqrt(shape["d"]) * 1.4426950408889634
    x = make_inputs(t, shape, True)
    q, kc, vc, cuq, seq = x["q"], x["k_cache"], x["v_cache"], x["cu_seqlens_q"], x["seq_lens_kv"]
    ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], cuq, seq, 16)
    cfg = TileConfig(kernel="gluon", rare_max=args.rare_max).resolved(16, 128, sm90=True)
    tiles = tile_table(cuq, t, 8, longest_first=False)
    u = tile_unions_for(cfg, ids, x["page_table"], cuq, tiles)
    items = build_rare_items(u.rare_ids, x["page_table"], cuq, 8)
    n = int(items.round_start[-1])
    rnd = torch.bucketize(torch.arange(n, device=q.device), items.round_start[1:].long(), right=True)
    key = (rnd.long() * 4 + items.g[:n].long()) * (1 << 24) + items.blk[:n].long()
    new_bucket = torch.ones(n, dtype=torch.bool, device=q.device)
    new_bucket[1:] = key[1:] != key[:-1]
    buckets = int(new_bucket.sum())
    sizes = torch.diff(torch.nonzero(torch.cat([new_bucket, new_bucket.new_ones(1)])).flatten())
    pairs = int((items.tok[:n] >= 0).sum())
    per_round = torch.diff(items.round_start).tolist()
    print(json.dumps(dict(size=t, rare_max=args.rare_max, items=n, pairs=pairs, buckets=buckets,
                          items_per_bucket=round(n / max(buckets, 1), 2),
                          bucket_items_hist={str(k): int((sizes == k).sum()) for k in (1, 2, 3, 4, 8, 16)},
                          bucket_items_max=int(sizes.max()) if n else 0, items_per_round=per_round,
                          union_steps=int(u.count.sum()))), flush=True)
    out, lse = torch.empty_like(q), torch.empty(t, shape["hq"], device="cuda")
    launch_gluon_tile(q, kc, vc, out, lse, cuq, seq, *tiles, u, scale, 16, 8, block_n=128, stages=2, persistent=True,
                      q_tma=True, dynamic=True)
    launch_gluon_rare(q, kc, vc, out, lse, cuq, seq, items, scale, 16, 8)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
