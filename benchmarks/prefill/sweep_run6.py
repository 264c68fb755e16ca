"""Run 6 (session 4 of issue 3): the tile kernel with half-block loop steps and a register cap, so that
two 8-warp programs share an SM (one's softmax overlapping the other's MMAs), and the window merge pass
of the rare pairs (tokens that chose the same rare block share its K/V read), against the run-5
default; each variant checked against the fp32 reference on the GPU before it is timed.

    python3 benchmarks/prefill/sweep_run6.py --out DIR [--budget-s 240] [--sizes 131072,65536]   # H200
    python3 benchmarks/prefill/sweep_run6.py --dry-cpu --out /tmp/x                             # tiny

Timing, FLOP conventions and the checks as ``sweep_run5.py`` (whose helpers it uses): median of
CUDA-event runs after a warm-up, 256 MiB L2 flush before each, structured index inputs, selections of
the real fused indexer, the union build inside every timed attention call.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import DRY  # noqa: E402
from sweep_run5 import start_run, sweep, whole_prefill  # noqa: E402
from kernels.sparse_prefill.config import TileConfig  # noqa: E402

BN64 = dict(tile_q=8, block_n=64, num_stages=2, maxnreg=128)
VARIANTS = {  # label -> TileConfig (M3: G = 16, 8-token tiles = 128 rows, 8 warps)
    "base: BN 128, 3 stages, rare_max 2, token pass (run-5 default)": TileConfig(tile_q=8, rare_max=2),
    "BN 64, 2 stages, maxnreg 128, rare_max 1, token pass": TileConfig(rare_max=1, **BN64),
    "BN 64 ..., rare_max 2, window pass": TileConfig(rare_max=2, rare_pass="window", **BN64),
    "BN 64 ..., rare_max 3, window pass": TileConfig(rare_max=3, rare_pass="window", **BN64),
    "BN 64 ..., rare_max 4, window pass": TileConfig(rare_max=4, rare_pass="window", **BN64),
    "BN 64 ..., rare_max 3, window pass, 4-token steps, 4 warps": TileConfig(rare_max=3, rare_pass="window", rare_chunk=4,
                                                                            rare_warps=4, **BN64),
    "BN 64 ..., rare_max 5, window pass": TileConfig(rare_max=5, rare_pass="window", **BN64),
}


def main() -> None:
    import argparse
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--sizes", default="131072,65536")
    own, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0]] + rest
    args, deadline, peak, info, rows = start_run(240)
    sizes = [int(s) for s in own.sizes.split(",")] if not DRY else [384]
    variants = VARIANTS if not DRY else dict(list(VARIANTS.items())[:3])
    save = lambda: Path(args.out, "run6.json").write_text(json.dumps(dict(info=info, rows=rows.rows), indent=1))  # noqa: E731
    for t in sizes:
        if time.time() > deadline:
            break
        try:
            best, good, ids, x = sweep(rows, "m3", t, variants, deadline, analyse=False)
            rows.add("m3", f"T={t}: fastest correct: {best}", float("nan"), None, json.dumps(good))
            save()
            whole_prefill(rows, "m3", t, variants.get(best), peak, deadline, x=x, ids=ids, dense=False)
            del x, ids
        except Exception:
            traceback.print_exc()
        if not DRY:
            torch.cuda.empty_cache()
        save()
    for rw in rows.rows:
        print(f"{rw['case'][:22]:<22} {rw['stage'][:70]:<70} {rw['ms']:>9.3f} {rw['tflops'] or '':>6} "
              f"{rw['frac_peak'] or '':>5} {rw['note'][:100]}")


if __name__ == "__main__":
    main()
