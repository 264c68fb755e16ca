"""Run 5 (session 3 of issue 3): where the tile kernel's executed work goes, a sweep of tile-kernel
options (each checked against the fp32 reference on the GPU before it is timed), then the M3 rows at
32K..1M and the SmolLM2 rows with the fastest correct option, against cuDNN dense.

    python3 benchmarks/prefill/sweep_run5.py --out DIR [--budget-s 240]      # on the H200
    python3 benchmarks/prefill/sweep_run5.py --dry-cpu --out /tmp/x          # tiny, interpreter

Timing and FLOP conventions as ``bench_prefill.py`` (helpers imported from it): median of CUDA-event
runs after a warm-up, 256 MiB L2 flush before each; structured index inputs; selections from the real
fused indexer; attention timed with ``check_ids=False`` and its union build included. The 1M dense
row is not re-run (one cold ~37 s run in run 1 is reused, see RESULTS.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import (DEV, DRY, SHAPES, make_inputs, reps_for, run_info, timed,  # noqa: E402
                           useful_attention_flops)
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.indexer.op import _launch_indexer  # noqa: E402
from kernels.sparse_prefill import msa_prefill_attention  # noqa: E402
from kernels.sparse_prefill.config import TileConfig, tile_block_m  # noqa: E402
from kernels.sparse_prefill.launch import _launch_tile, tile_unions_for  # noqa: E402
from kernels.sparse_prefill.naive import _chunk_attention  # noqa: E402
from kernels.sparse_prefill.unions import build_unions  # noqa: E402

VARIANTS = {  # label -> TileConfig (M3: G = 16)
    "base TQ8 rare2 w8 s3 (default)": TileConfig(tile_q=8, rare_max=2),
    "rare pass 1 stage": TileConfig(tile_q=8, rare_max=2, rare_stages=1),
    "lazy rescale": TileConfig(tile_q=8, rare_max=2, lazy=True),
    "exp FMA": TileConfig(tile_q=8, rare_max=2, exp_fma=True),
    "lazy + exp FMA": TileConfig(tile_q=8, rare_max=2, lazy=True, exp_fma=True),
    "TQ8 head split 2 (64 rows) w4 s1": TileConfig(tile_q=8, rare_max=2, head_split=2, num_warps=4, num_stages=1),
    "TQ8 head split 2 (64 rows) w4 s2": TileConfig(tile_q=8, rare_max=2, head_split=2, num_warps=4, num_stages=2),
    "TQ4 (64 rows) rare1 w4 s1": TileConfig(tile_q=4, rare_max=1, num_warps=4, num_stages=1),
    "TQ4 (64 rows) rare1 w4 s2": TileConfig(tile_q=4, rare_max=1, num_warps=4, num_stages=2),
    "rare1, rare pass 1 stage": TileConfig(tile_q=8, rare_max=1, rare_stages=1),
    "rare3, rare pass 1 stage": TileConfig(tile_q=8, rare_max=3, rare_stages=1),
}
OLD_1M_DENSE_MS = 37055.93  # run 1, one cold cuDNN run at T = 1M (RESULTS.md), reused


def case_label(name, t):
    return f"{name} T={t // 1024}K structured" if t >= 1024 else f"{name} T={t} structured"


class Rows:
    def __init__(self, peak):
        self.peak, self.rows = peak, []

    def add(self, case, stage, ms, flops=None, note=""):
        tf = flops / ms / 1e9 if flops and ms == ms else None
        self.rows.append(dict(case=case, stage=stage, ms=round(ms, 3), tflops=round(tf, 1) if tf else None,
                              frac_peak=round(tf / self.peak, 3) if tf else None, note=note))
        print(json.dumps(self.rows[-1]), flush=True)


def attention_fn(x, ids, cfg, out, lse, scale):
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    t = x["q"].shape[0]
    tiles = tile_table(x["cu_seqlens_q"], t, cfg.tile_q, longest_first=False)

    def fn():  # union build (and the regrouping, if on) included, as in run 4
        union = tile_unions_for(cfg, ids, x["page_table"], x["cu_seqlens_q"], tiles)
        _launch_tile(*args, ids, out, lse, scale, cfg.tile_q, tiles=tiles, union=union, config=cfg)
    return fn


def reference_error(x, ids, out, lse, scale, group, windows=3, width=128):
    """Max relative error (out) and max |LSE error| over a few token windows, fp32 reference on the GPU."""
    t = x["q"].shape[0]
    worst_rel, worst_lse = 0.0, 0.0
    kc, vc = x["k_cache"], x["v_cache"]
    for w in range(windows):
        t0 = min(t - width, (t - width) * w // max(windows - 1, 1)) if t > width else 0
        t1 = min(t, t0 + width)
        pos = torch.arange(t0, t1, device=ids.device)  # single request, no prefix: position = index
        ref_o, ref_l = _chunk_attention(x["q"][t0:t1], kc, vc, x["page_table"][0], pos, ids[t0:t1], scale, group)
        rel = ((out[t0:t1].float() - ref_o).norm() / ref_o.norm()).item()
        dl = (lse[t0:t1] - ref_l).abs().max().item()
        worst_rel, worst_lse = max(worst_rel, rel), max(worst_lse, dl)
    return worst_rel, worst_lse


def waste(x, ids, shape, cfg):
    """Executed vs useful MMA work of one tile config: union per tile, rare pairs, member rows."""
    t = x["q"].shape[0]
    group = shape["hq"] // shape["hkv"]
    tiles = tile_table(x["cu_seqlens_q"], t, cfg.tile_q, longest_first=False)
    u = build_unions(ids, x["page_table"], x["cu_seqlens_q"], *tiles, cfg.tile_q, rare_max=cfg.rare_max)
    valid = tiles[0] >= 0
    count = u.count[valid].double()
    masks = u.token_mask[valid]
    bits = sum(((masks >> j) & 1) for j in range(cfg.tile_q)).double()  # tokens per union entry
    per_block = 4.0 * shape["block"] * shape["d"]
    tile_exec = count.sum().item() * tile_block_m(cfg.tile_q, group, cfg.head_split) * cfg.head_split * per_block
    member = bits.sum().item() * group * per_block
    rare_pairs = (u.rare_ids >= 0).sum().item() if u.rare_ids is not None else 0
    rare_exec = rare_pairs * max(16, group) * per_block
    useful = useful_attention_flops(ids, t, shape)
    return dict(union_per_tile=round(count.mean().item(), 2), rare_per_token=round(rare_pairs / (t * shape["hkv"]), 3),
                tokens_per_union_block=round((bits.sum() / count.sum()).item(), 2),
                member_row_share=round(member / tile_exec, 3), useful_share_of_executed=round(useful / (tile_exec + rare_exec), 3),
                rare_share_of_useful=round(rare_pairs * group * per_block / useful, 3))


def sweep(rows, name, t, variants, deadline, x=None, ids=None, analyse=True):
    """Every variant: reference check, then timing. Returns (best label, {label: ms} of the correct
    ones, ids, inputs)."""
    shape = SHAPES[name]
    x = x if x is not None else make_inputs(t, shape, True)
    case = case_label(name, t)
    idx_args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    r = reps_for(512 * shape["d_idx"] / 128 * shape["hkv"] / 4 * t * t / 500e12 * 1e3)
    ids = ids if ids is not None else msa_indexer(*idx_args, shape["topk"])
    flops = useful_attention_flops(ids, t, shape)
    group, scale = shape["hq"] // shape["hkv"], 1 / math.sqrt(shape["d"])
    for cfg_label, cfg in [] if not analyse else [("rare0", TileConfig(tile_q=8, rare_max=0)), ("rare2", TileConfig(tile_q=8, rare_max=2)),
                           ("TQ4 rare1", TileConfig(tile_q=4, rare_max=1))]:
        rows.add(case, f"work analysis {cfg_label}", float("nan"), None, json.dumps(waste(x, ids, shape, cfg)))
    out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=DEV)
    base_out, results = None, {}
    for label, cfg in variants.items():
        if time.time() > deadline:
            rows.add(case, f"attention {label}", float("nan"), None, "skipped: budget")
            continue
        try:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            fn = attention_fn(x, ids, cfg, out, lse, scale)
            fn()
            nan = bool(torch.isnan(out).any() or torch.isnan(lse).any())
            rel, dl = reference_error(x, ids, out, lse, scale, group)
            if base_out is None:
                base_out = out.clone()
            diff = (out.float() - base_out.float()).abs().max().item()
            ok = not nan and rel < 1e-2 and dl < 1e-3
            ms = timed(fn, r)
            results[label] = (ms, ok)
            rows.add(case, f"attention {label}", ms, flops,
                     f"ref rel err {rel:.2e}, lse err {dl:.1e}, max|diff vs base| {diff:.3g}, nan {nan}, ok {ok}")
        except Exception as exc:  # one failing variant must not lose the others
            traceback.print_exc()
            rows.add(case, f"attention {label}", float("nan"), None, repr(exc)[:160])
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    # (in run 5's call 1 "auto" was the gated device-side choice, today's "auto_device")
    t_api = timed(lambda: msa_prefill_attention(*args, ids, check_ids=False), r)
    rows.add(case, "op defaults (design auto: host sync on the mean union, host length check)", t_api, flops)
    t_api = timed(lambda: msa_prefill_attention(*args, ids, design="tile", check_ids=False, check_lengths=False), r)
    rows.add(case, "op as the engine calls it (design tile, check_lengths=False: no sync)", t_api, flops)
    good = {k: v[0] for k, v in results.items() if v[1]}
    best = min(good, key=good.get) if good else None
    return best, good, ids, x


def combine(good, base_label):
    """One config joining every single option that beat the base by more than 1%."""
    base = good.get(base_label)
    if base is None:
        return None
    cfg = dict(tile_q=8, rare_max=2)
    wins = [k for k, v in good.items() if v < 0.99 * base]
    if "rare pass 1 stage" in wins:
        cfg["rare_stages"] = 1
    if "lazy rescale" in wins or "lazy + exp FMA" in wins:
        cfg["lazy"] = True
    if "exp FMA" in wins or "lazy + exp FMA" in wins:
        cfg["exp_fma"] = True
    return TileConfig(**cfg) if len(cfg) > 2 else None


def whole_prefill(rows, name, t, cfg, peak, deadline, x=None, ids=None, dense=True, topk_baseline=False):
    """Indexer, attention (``cfg``; None: op defaults), total, dense cuDNN (or the reused 1M number)."""
    shape = SHAPES[name]
    x = x if x is not None else make_inputs(t, shape, True)
    case = case_label(name, t)
    idx_args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    r = reps_for(512 * shape["d_idx"] / 128 * shape["hkv"] / 4 * t * t / 500e12 * 1e3)
    t_idx = timed(lambda: msa_indexer(*idx_args, shape["topk"]), r)
    rows.add(case, "indexer fused (score+max+top-k)", t_idx, 2 * shape["d_idx"] * shape["hkv"] * t * (t + 1) / 2)
    ids = ids if ids is not None else msa_indexer(*idx_args, shape["topk"])
    if topk_baseline:
        t_s = timed(lambda: _launch_indexer(*idx_args, 4, mode=2), r)
        scores = _launch_indexer(*idx_args, 4, mode=1)
        t_tk = timed(lambda: torch.topk(scores, min(shape["topk"] - 1, scores.shape[-1]), dim=-1), reps_for(10))
        rows.add(case, "top-k stage (fused minus score-only) vs torch.topk", t_idx - t_s, None,
                 f"torch.topk {t_tk:.3f} ms -> {t_tk / max(t_idx - t_s, 1e-3):.1f}x (difference of two medians)")
        del scores
    flops = useful_attention_flops(ids, t, shape)
    args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    if cfg is None:
        t_att = timed(lambda: msa_prefill_attention(*args, ids, check_ids=False), r)
        rows.add(case, "attention, op defaults (auto design)", t_att, flops)
    else:
        out, lse = torch.empty_like(x["q"]), torch.empty(t, shape["hq"], device=DEV)
        t_att = timed(attention_fn(x, ids, cfg, out, lse, 1 / math.sqrt(shape["d"])), r)
        rows.add(case, f"attention {cfg}", t_att, flops)
        del out, lse
    total = t_idx + t_att
    rows.add(case, "MSA total = indexer + attention", total)
    dense_flops = 4 * shape["d"] * shape["hq"] * t * (t + 1) / 2
    if t >= 1 << 20:
        rows.add(case, "dense causal SDPA (cuDNN), run 1 number reused", OLD_1M_DENSE_MS, dense_flops,
                 f"MSA speed-up {OLD_1M_DENSE_MS / total:.1f}x (not re-run: one cold 37 s run)")
    elif dense and time.time() < deadline:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        group = shape["hq"] // shape["hkv"]
        pt = x["page_table"][0].long()
        q = x["q"].transpose(0, 1)[None].contiguous()
        k = x["k_cache"][pt].permute(1, 0, 2, 3).reshape(shape["hkv"], -1, shape["d"])[:, :t].repeat_interleave(group, 0)[None]
        v = x["v_cache"][pt].permute(1, 0, 2, 3).reshape(shape["hkv"], -1, shape["d"])[:, :t].repeat_interleave(group, 0)[None]
        del x
        with sdpa_kernel([SDPBackend.MATH if DRY else SDPBackend.CUDNN_ATTENTION]):
            t_d = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                        reps_for(dense_flops / 550e12 * 1e3))
        rows.add(case, "dense causal SDPA (cuDNN)", t_d, dense_flops, f"MSA speed-up {t_d / total:.2f}x")


def start_run(default_budget_s: float):
    """Parse --out / --budget-s / --dry-cpu, measure the bf16 matmul peak, print the run's info line.

    Returns (args, deadline, peak, info, rows): what both run-5 sweeps start from."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=default_budget_s)
    ap.add_argument("--dry-cpu", action="store_true")
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    peak, info = run_info()
    return args, deadline, peak, info, Rows(peak)


def main() -> None:
    args, deadline, peak, info, rows = start_run(240)
    big, mid = (131072, 65536) if not DRY else (512, 256)
    save = lambda: Path(args.out, "run5.json").write_text(json.dumps(dict(info=info, rows=rows.rows), indent=1))  # noqa: E731
    best_cfg = None
    variants = VARIANTS if not DRY else {k: VARIANTS[k] for k in list(VARIANTS)[:3] + list(VARIANTS)[5:8:2]}
    try:
        best, good, ids, x = sweep(rows, "m3", big, variants, deadline)
        combo = combine(good, "base TQ8 rare2 w8 s3 (default)")
        if combo is not None and time.time() < deadline:
            _, good2, _, _ = sweep(rows, "m3", big, {"combined winners": combo}, deadline, x=x, ids=ids, analyse=False)
            good.update(good2)
        best = min(good, key=good.get) if good else None
        best_cfg = VARIANTS.get(best, combo)
        rows.add("m3", f"chosen: {best}", float("nan"), None, str(best_cfg))
        save()
        whole_prefill(rows, "m3", big, best_cfg, peak, deadline, x=x, ids=ids)
        del x, ids
        torch.cuda.empty_cache() if not DRY else None
        mid_variants = {k: VARIANTS[k] for k in ("base TQ8 rare2 w8 s3 (default)",) if k in VARIANTS}
        if best in VARIANTS and best not in mid_variants:
            mid_variants[best] = VARIANTS[best]
        _, _, ids, x = sweep(rows, "m3", mid, mid_variants, deadline)
        whole_prefill(rows, "m3", mid, best_cfg, peak, deadline, x=x, ids=ids)
        del x, ids
    except Exception:
        traceback.print_exc()
    save()
    plan = [("m3", 32768), ("m3", 262144), ("smollm2", 131072), ("smollm2", 32768), ("m3", 1 << 20)]
    if DRY:
        plan = [("m3", 384), ("smollm2", 512)]
    for name, t in plan:
        if time.time() > deadline:
            rows.add(case_label(name, t), "skipped: budget spent", float("nan"))
            continue
        run_guarded(lambda: whole_prefill(rows, name, t, best_cfg if name == "m3" else None, peak, deadline,
                                          topk_baseline=(name == "smollm2")), save)
    print_rows(rows)


def run_guarded(fn, save) -> None:
    """One case of a sweep: a failure is printed, not fatal; then the GPU cache is freed and the rows so
    far are saved."""
    try:
        fn()
    except Exception:  # one failing case must not lose the others
        traceback.print_exc()
    if not DRY:
        torch.cuda.empty_cache()
    save()


def print_rows(rows: Rows) -> None:
    """The run's rows as one fixed-width table (the end of every run-5/6 sweep's log)."""
    for rw in rows.rows:
        print(f"{rw['case'][:22]:<22} {rw['stage'][:70]:<70} {rw['ms']:>9.3f} {rw['tflops'] or '':>6} "
              f"{rw['frac_peak'] or '':>5} {rw['note'][:100]}")


if __name__ == "__main__":
    main()
