"""Before/after sweep of the MSA prefill kernels (M3 shape, structured inputs, selections from the indexer):
indexer tile sizes and stages, union build (torch sorts vs Triton), the previous tile kernel against the
current one, the per-token fallback, cuDNN dense. Timing and FLOP conventions as in ``bench_prefill.py``
(helpers imported from it).

    python benchmarks/prefill/sweep_prefill.py --sizes m3:131072,m3:65536 --out DIR   # ~60 s on an H200

The "before" rows need the previous kernel as ``benchmarks/prefill/_before/{old_op,old_tile_kernel}.py``
(untracked: ``git show c400bd4:kernels/sparse_prefill/op.py`` and ``.../triton_sparse_attention.py``, with
old_op's kernel import pointed at old_tile_kernel); without them those rows are skipped.
(Run 2 of RESULTS.md ran this code as ``bench_prefill.py --sweep``; it moved here unchanged.)
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
from bench_prefill import (DEV, DRY, SHAPES, make_inputs, reps_for, run_cases, run_info, timed,  # noqa: E402
                           useful_attention_flops)
from kernels._common.tiles import tile_table  # noqa: E402
from kernels.indexer import msa_indexer  # noqa: E402
from kernels.indexer.op import _launch_indexer  # noqa: E402
from kernels.sparse_prefill import msa_prefill_attention  # noqa: E402
from kernels.sparse_prefill.op import _launch_tile, build_unions, default_tile_q, tile_unions  # noqa: E402


def sweep_one(name: str, t: int, peak: float, with_token: bool, with_dense: bool) -> list[dict]:
    """One size: rows printed as JSON lines as they come, returned as a list."""
    shape = SHAPES[name]
    x = make_inputs(t, shape, True)
    idx_args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    att_args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    label = f"{name} T={t // 1024}K structured"
    causal = t * (t + 1) / 2
    rows = []

    def row(stage, ms, flops=None, note=""):
        tf = flops / ms / 1e9 if flops else None
        rows.append(dict(case=label, stage=stage, ms=round(ms, 3), tflops=round(tf, 1) if tf else None,
                         frac_peak=round(tf / peak, 3) if tf else None, note=note))
        print(json.dumps(rows[-1]), flush=True)

    est = 512 * shape["d_idx"] / 128 * shape["hkv"] / 4 * t * t / 500e12 * 1e3
    r = reps_for(est)
    idx_flops = 2 * shape["d_idx"] * shape["hkv"] * causal
    ids = msa_indexer(*idx_args, shape["topk"])
    best_idx = None
    for rows_, warps, stages in [(128, 8, 3), (256, 8, 2), (256, 8, 3), (128, 8, 2)]:
        try:
            fn = lambda: _launch_indexer(*idx_args, shape["topk"], mode=0, num_warps=warps,  # noqa: E731
                                         num_stages=stages, tile_rows=rows_)
            same = torch.equal(fn(), ids)
            t_i = timed(fn, r)
            row(f"indexer fused rows={rows_} warps={warps} stages={stages}", t_i, idx_flops,
                f"ids equal to default: {same}")
            if same and (best_idx is None or t_i < best_idx):
                best_idx = t_i
        except Exception as exc:
            row(f"indexer fused rows={rows_} warps={warps} stages={stages}", float("nan"), None, repr(exc)[:200])
    att_flops = useful_attention_flops(ids, t, shape)
    group = shape["hq"] // shape["hkv"]
    tq = default_tile_q(group)
    tr, ts = tile_table(x["cu_seqlens_q"], t, tq, longest_first=False)
    old_union, count = tile_unions(ids, tr, ts, x["cu_seqlens_q"], tq)
    mean_u = count[tr >= 0].float().mean().item()
    t_u_old = timed(lambda: tile_unions(ids, tr, ts, x["cu_seqlens_q"], tq), 5)
    row(f"union build, torch sorts (before) TQ={tq}", t_u_old, None)
    t_u_new = timed(lambda: build_unions(ids, x["page_table"], x["cu_seqlens_q"], tr, ts, tq), 5)
    row(f"union build, Triton kernel (after) TQ={tq}", t_u_new, None)
    del old_union
    try:
        from benchmarks.prefill._before import old_op
    except ImportError:
        old_op = None
    t_old, out_old = float("nan"), msa_prefill_attention(*att_args, ids, design="tile", tile_q=tq, check_ids=False)[0]
    if old_op is not None:
        t_old = timed(lambda: old_op.msa_prefill_attention(*att_args, ids, design="tile", tile_q=tq,
                                                           check_ids=False), r)
        out_old = old_op.msa_prefill_attention(*att_args, ids, design="tile", tile_q=tq, check_ids=False)[0]
        row(f"attention tile TQ={tq} BEFORE (committed kernel + torch unions)", t_old, att_flops,
            f"mean union {mean_u:.1f}")
    best_att = None
    out_b = torch.empty_like(x["q"])
    lse_b = torch.empty(t, shape["hq"], device=DEV)
    scale = 1 / math.sqrt(shape["d"])
    for stages in (2, 3):
        try:
            def fn(stages=stages):
                union = build_unions(ids, x["page_table"], x["cu_seqlens_q"], tr, ts, tq)
                _launch_tile(*att_args, ids, out_b, lse_b, scale, tq, num_stages=stages, tiles=(tr, ts), union=union)
            fn()
            diff = (out_b.float() - out_old.float()).abs().max().item()
            t_new = timed(fn, r)
            row(f"attention tile TQ={tq} AFTER stages={stages} (incl. union build)", t_new, att_flops,
                f"max|after-before|={diff:.3g}")
            if best_att is None or t_new < best_att:
                best_att = t_new
        except Exception as exc:
            row(f"attention tile TQ={tq} AFTER stages={stages}", float("nan"), None, repr(exc)[:200])
    t_api = timed(lambda: msa_prefill_attention(*att_args, ids, design="tile", tile_q=tq, check_ids=False), r)
    row(f"attention tile TQ={tq} AFTER via msa_prefill_attention (defaults)", t_api, att_flops)
    del out_b, lse_b, out_old
    if with_token:
        t_tok = timed(lambda: msa_prefill_attention(*att_args, ids, design="token", check_ids=False), r)
        row("attention per-token (fallback)", t_tok, att_flops)
    t_default_idx = next(rw["ms"] for rw in rows if rw["stage"].startswith("indexer fused rows=128 warps=8 stages=3"))
    row("MSA total BEFORE = indexer (default) + tile attention (before)", t_default_idx + t_old)
    total = (best_idx or t_default_idx) + min(best_att or 1e9, t_api)
    row("MSA total AFTER = best indexer + best tile attention", total)
    if with_dense:
        dense_flops = 4 * shape["d"] * shape["hq"] * causal
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q = x["q"].transpose(0, 1)[None].contiguous()
        pt = x["page_table"][0].long()
        k = x["k_cache"][pt].permute(1, 0, 2, 3).reshape(shape["hkv"], -1, shape["d"])[:, :t]
        v = x["v_cache"][pt].permute(1, 0, 2, 3).reshape(shape["hkv"], -1, shape["d"])[:, :t]
        k = k.repeat_interleave(group, 0)[None]
        v = v.repeat_interleave(group, 0)[None]
        del x
        with sdpa_kernel([SDPBackend.MATH if DRY else SDPBackend.CUDNN_ATTENTION]):
            t_dense = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                            reps_for(dense_flops / 550e12 * 1e3))
        row("dense causal SDPA (cuDNN)", t_dense, dense_flops,
            f"speed-up before {t_dense / (t_default_idx + t_old):.2f}x, after {t_dense / total:.2f}x")
    return rows



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sizes", default="m3:131072,m3:65536")
    ap.add_argument("--dry-cpu", action="store_true", help="tiny CPU run through the interpreter")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    peak, info = run_info()

    def one(item: str) -> list[dict]:
        name, t = item.split(":")
        return sweep_one(name, int(t), peak, with_token=int(t) <= 65536, with_dense=True)

    rows = run_cases(args.sizes.split(","), one, Path(args.out, "sweep.json"), info)
    for r in rows:
        print(f"{r['case']:<22} {r['stage']:<66} {r['ms']:>9.3f} ms {r['tflops'] or '':>7} {r['note']}")


if __name__ == "__main__":
    main()
