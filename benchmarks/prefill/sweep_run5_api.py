"""Run 5, second call: what the public op costs on top of the bare kernels (design choice, host
syncs, gating), exp FMA against the plain softmax in alternating rounds, and the sparse attention of
the committed defaults at 32K..1M (M3 shape, structured inputs, real indexer selections).

    python3 benchmarks/prefill/sweep_run5_api.py --out DIR      # on the H200, ~60 s
    python3 benchmarks/prefill/sweep_run5_api.py --dry-cpu --out /tmp/x

Variants of one attention call (outputs compared bit for bit with the explicit tile launch):
explicit = union build + tile kernel + merge pass with prebuilt tile tables (what run 4 timed);
op tile = ``msa_prefill_attention(design="tile")``; op auto_device = the device-side choice (gated
launches), with and without the host length check; old auto = the session-2 op path and today's
``auto`` (one host sync on the mean union, then the chosen kernel); explicit gated = the gated
kernels with a preset flag.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import DEV, DRY, SHAPES, make_inputs, reps_for, timed, useful_attention_flops  # noqa: E402
from sweep_run5 import case_label, print_rows, start_run  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.sparse_prefill import msa_prefill_attention  # noqa: E402
from kernels.sparse_prefill.config import TileConfig, tile_flag  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, _launch_token  # noqa: E402
from kernels.sparse_prefill.unions import build_unions  # noqa: E402


def variants(x, ids, shape, cfg):
    t = x["q"].shape[0]
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    group, scale = shape["hq"] // shape["hkv"], 1 / math.sqrt(shape["d"])
    out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=DEV)
    tiles = tile_table(x["cu_seqlens_q"], t, cfg.tile_q, longest_first=False)
    one = torch.ones(1, dtype=torch.int32, device=DEV)

    def explicit(flag=None):
        union = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, cfg.tile_q, rare_max=cfg.rare_max)
        _launch_tile(*args, ids, out, lse, scale, cfg.tile_q, tiles=tiles, union=union, config=cfg, flag=flag)
        return out

    def old_auto():  # session 2's op: validation with its sync, tile table, unions, host sync, launch
        x["cu_seqlens_q"].tolist(), x["seq_lens_kv"].tolist()  # the host length check
        tl_ = tile_table(x["cu_seqlens_q"], t, cfg.tile_q, longest_first=False)
        union = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tl_, cfg.tile_q, rare_max=cfg.rare_max)
        use_tile = tile_flag(union.count, union.rare_ids, tl_[0], ids.shape[2], cfg.tile_q, group).item()
        o, l_ = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=DEV)
        if use_tile:
            _launch_tile(*args, ids, o, l_, scale, cfg.tile_q, tiles=tl_, union=union, config=cfg)
        else:
            _launch_token(*args, ids, o, l_, scale)
        return o

    return {
        "explicit tile launch (prebuilt tile table)": explicit,
        "explicit, gated kernels (flag preset to tile)": lambda: explicit(one),
        "op design='tile', check_lengths=False": lambda: msa_prefill_attention(*args, ids, impl="triton", design="tile", check_ids=False,
                                                                                check_lengths=False, tile_config=cfg)[0],
        "op design='auto_device' (device choice), check_lengths=False: no sync": lambda: msa_prefill_attention(
            *args, ids, impl="triton", design="auto_device", check_ids=False, check_lengths=False, tile_config=cfg)[0],
        "op design='auto_device', host length check (1 sync)": lambda: msa_prefill_attention(
            *args, ids, impl="triton", design="auto_device", check_ids=False, tile_config=cfg)[0],
        "session-2 op path: auto with a host sync on the mean union": old_auto,
    }


def api_overhead(rows, t, cfg, rounds=3):
    shape = SHAPES["m3"]
    x = make_inputs(t, shape, True)
    case = case_label("m3", t)
    ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], shape["topk"])
    flops = useful_attention_flops(ids, t, shape)
    r = reps_for(512 * t * t / 500e12 * 1e3)
    vs = variants(x, ids, shape, cfg)
    ref = vs["explicit tile launch (prebuilt tile table)"]().clone()
    for name, fn in vs.items():
        same = torch.equal(fn(), ref)
        rows.add(case, name, timed(fn, r), flops, f"bit-equal to explicit: {same}")
    configs = {"plain softmax": TileConfig(tile_q=cfg.tile_q, rare_max=cfg.rare_max, exp_fma=False),
               "exp FMA": TileConfig(tile_q=cfg.tile_q, rare_max=cfg.rare_max, exp_fma=True),
               "exp FMA, merge pass 3 stages": TileConfig(tile_q=cfg.tile_q, rare_max=cfg.rare_max, exp_fma=True,
                                                          rare_stages=3)}
    times = {tag: [] for tag in configs}
    for _ in range(rounds):  # alternating: the difference is ~1%, the run-to-run spread about as much
        for tag, c in configs.items():
            times[tag].append(timed(variants(x, ids, shape, c)["explicit tile launch (prebuilt tile table)"], r))
    for tag, ts in times.items():
        ts.sort()
        rows.add(case, f"explicit, {tag} ({rounds} alternating rounds, median)", ts[len(ts) // 2], flops,
                 f"range {ts[0]:.3f}-{ts[-1]:.3f} ms")


def defaults_at(rows, t):
    """Sparse attention of the committed defaults through the op as the engine calls it."""
    shape = SHAPES["m3"]
    x = make_inputs(t, shape, True)
    ids = msa_indexer(x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"], shape["topk"])
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    r = reps_for(512 * t * t / 500e12 * 1e3)
    ms = timed(lambda: msa_prefill_attention(*args, ids, impl="triton", design="auto_device", check_ids=False,
                                             check_lengths=False), r)
    rows.add(case_label("m3", t), "attention via the op, design auto_device (run 5: then called auto), no sync", ms,
             useful_attention_flops(ids, t, shape))


def main() -> None:
    args, deadline, peak, info, rows = start_run(120)
    cfg = TileConfig().resolved(16)
    plan = [("api", 131072), ("api", 65536), ("defaults", 32768), ("defaults", 262144), ("defaults", 1 << 20)]
    if DRY:
        plan = [("api", 512), ("defaults", 256)]
    for what, t in plan:
        if time.time() > deadline:
            rows.add(case_label("m3", t), f"{what}: skipped, budget spent", float("nan"))
            continue
        try:
            api_overhead(rows, t, cfg) if what == "api" else defaults_at(rows, t)
        except Exception:
            traceback.print_exc()
        if not DRY:
            torch.cuda.empty_cache()
        Path(args.out, "run5_api.json").write_text(json.dumps(dict(info=info, rows=rows.rows), indent=1))
    print_rows(rows)


if __name__ == "__main__":
    main()
