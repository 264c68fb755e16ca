"""Launch-knob sweep of the MSA decode kernels at 128K, q_len 1 (M3 shape), one CUDA-graph timing each:
indexer (bf16 keys; fp8 keys with the fp16-convert dot or the fp8 x fp8 dot) over pages per iteration
and warps, sparse attention over split counts and pipeline stages, our dense decode, then the MSA step
with the checked-out defaults ("default") and with the fastest knobs of the cell ("best"); fp8-vs-bf16
selection agreement last. (In run 3 "default" was the previous defaults, since replaced by the best.)
Timing method and byte counts as in ``bench_decode.py`` (helpers imported from it).

    python benchmarks/decode/sweep_decode.py --batches 32,64,8,128 --out DIR    # ~60 s on an H200
    python benchmarks/decode/sweep_decode.py --smoke-cpu --batches 2 --out DIR  # script check (interpreter)

(Run 3 of RESULTS.md ran this code as ``bench_decode.py --sweep``; it moved here unchanged.)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_decode as bd  # noqa: E402  (sets TRITON_INTERPRET for --smoke-cpu before triton loads)
from bench_decode import D, D_IDX, HKV, HQ, PAGE, TOPK, Cell, graph_time, n_rotations, sparse_bytes  # noqa: E402
from kernels.decode import DenseDecodePlan, MSADecodePlan  # noqa: E402

DEVICE = "cuda"


INDEXER_VARIANTS = [  # (pages_per_iter, num_warps, fp8_dot): fp8_dot only with fp8 keys
    (1, 4, False), (2, 4, False), (4, 4, False), (4, 8, False), (1, 4, True), (4, 4, True), (4, 8, True)]
SPARSE_VARIANTS = [(None, 2), (1, 2), (1, 3), (2, 2), (2, 3), (4, 3)]  # (splits or None = heuristic, stages)


def sweep_cell(cell: Cell, q_len: int, emit) -> None:
    """Launch-knob sweep at one cell: indexer (bf16 / fp8 keys) and sparse attention variants, then the MSA
    step with the fastest indexer and attention knobs of this cell, and our dense decode."""
    tokens = cell.batch * q_len
    q = torch.randn(tokens, HQ, D, dtype=torch.bfloat16, device=DEVICE)
    q_idx = torch.randn(tokens, HKV, D_IDX, dtype=torch.bfloat16, device=DEVICE)
    hist_pages = cell.batch * ((cell.ctx - 1) // PAGE)
    key_bytes = {"bf16": hist_pages * PAGE * D_IDX * 2, "fp8": hist_pages * PAGE * (D_IDX + 4)}
    keys = {"bf16": (cell.k_idx, None), "fp8": (cell.k8, cell.k8_scale)}
    base = {"kind": "sweep", "batch": cell.batch, "ctx": cell.ctx, "q_len": q_len}

    def plans(**kw):
        out = []
        for table in cell.tables:
            m = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device=DEVICE, **kw)
            m.plan(cell.seq_lens, table, q_len)
            out.append(m)
        return out

    best = {}
    ref_ids = None
    for kind in ("bf16", "fp8"):
        for ppi, warps, fp8_dot in INDEXER_VARIANTS:
            if fp8_dot and kind == "bf16":
                continue
            try:
                ms = plans(index_fp8_dot=fp8_dot, tuning=dict(pages_per_iter=ppi, num_warps=warps))
                t = graph_time([lambda m=m: m.run_indexer(q_idx, *keys[kind]) for m in ms])
                ids = ms[0].run_indexer(q_idx, *keys[kind]).clone()
                if ref_ids is None:
                    ref_ids = ids
                hist_a, hist_b = ids[..., : TOPK - 1].long(), ref_ids[..., : TOPK - 1].long()
                agree = (hist_a[..., :, None] == hist_b[..., None, :]).any(-1).float().mean().item()
                emit({**base, "stage": "indexer", "keys": kind, "ppi": ppi, "warps": warps, "fp8_dot": fp8_dot,
                      "s": t, "bytes": key_bytes[kind], "agree_vs_first_bf16": agree,
                      "index_splits": ms[0].index_splits})
                key = kind + ("_dot" if fp8_dot else "")
                if t < best.get(key, (1e9,))[0] and (agree > 0.999 or kind == "fp8"):
                    best[key] = (t, dict(index_fp8_dot=fp8_dot), dict(pages_per_iter=ppi, num_warps=warps))
                del ms
            except Exception as exc:
                emit({**base, "stage": "indexer", "keys": kind, "ppi": ppi, "warps": warps, "fp8_dot": fp8_dot,
                      "error": repr(exc)[:300]})
    ms = plans()
    for m in ms:
        m.run_indexer(q_idx, cell.k_idx)
    sp_bytes, _ = sparse_bytes(ms[0].topk_ids, cell.seq_lens, q_len)
    ids_fixed = ms[0].topk_ids.clone()
    for splits, stages in SPARSE_VARIANTS:
        try:
            sp = plans(num_splits=splits, tuning=dict(attn_num_stages=stages))
            for m in sp:
                m.topk_ids.copy_(ids_fixed)
            t = graph_time([lambda m=m: m.run_attention(q, cell.k_cache, cell.v_cache) for m in sp])
            emit({**base, "stage": "sparse", "splits": sp[0].attn_splits, "stages": stages, "s": t,
                  "bytes": sp_bytes, "heuristic": splits is None})
            if t < best.get("sparse", (1e9,))[0]:
                best["sparse"] = (t, dict(num_splits=splits), dict(attn_num_stages=stages))
            del sp
        except Exception as exc:
            emit({**base, "stage": "sparse", "splits": splits, "stages": stages, "error": repr(exc)[:300]})
    del ms
    dense = []
    for table in cell.tables:
        d = DenseDecodePlan(HQ, HKV, D, PAGE, device=DEVICE)
        d.plan(cell.seq_lens, table, q_len)
        dense.append(d)
    t_dense = graph_time([lambda d=d: d.run(q, cell.k_cache, cell.v_cache) for d in dense])
    emit({**base, "stage": "dense", "s": t_dense, "bytes": cell.batch * cell.ctx * HKV * 2 * D * 2})
    del dense
    for kind, key in (("bf16", "bf16"), ("fp8", "fp8"), ("fp8", "fp8_dot")):
        for label, idx_cfg in (("default", None), ("best", best.get(key))):
            if label == "default" and key == "fp8_dot":
                continue
            kw, tuning = {}, {}
            if label == "best":
                if idx_cfg is None or "sparse" not in best:
                    continue
                kw.update(idx_cfg[1])
                kw.update(best["sparse"][1])
                tuning.update(idx_cfg[2])
                tuning.update(best["sparse"][2])
            ms = plans(tuning=tuning, **kw)
            t = graph_time([lambda m=m: m.run(q, q_idx, cell.k_cache, cell.v_cache, *keys[kind]) for m in ms])
            emit({**base, "stage": "msa_step", "keys": key, "config": label, "knobs": {**kw, **tuning},
                  "s": t, "dense_over_step": t_dense / t})
            del ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--batches", default="32,64,8,128")
    ap.add_argument("--smoke-cpu", action="store_true", help="tiny sizes on the CPU interpreter (script check)")
    args = ap.parse_args()
    global DEVICE
    if args.smoke_cpu:
        DEVICE = bd.DEVICE = "cpu"
    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "bench_decode.jsonl"), "w")

    def emit(rec):
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(json.dumps(rec), flush=True)

    import triton
    gpu = torch.cuda.get_device_properties(0) if DEVICE == "cuda" else None
    emit({"kind": "env", "gpu": gpu.name if gpu else "cpu", "sms": gpu.multi_processor_count if gpu else 0,
          "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
          "command": " ".join(sys.argv)})
    if DEVICE == "cuda":
        cb = bd.copy_bandwidth()
        emit({"kind": "copy", "bytes_per_s": max(cb.values()), **cb})
    ctx = 2200 if args.smoke_cpu else 131072
    for batch in [int(b) for b in args.batches.split(",")]:
        try:
            cell = Cell(batch, ctx, n_rotations(batch, ctx), fp8=True)
            sweep_cell(cell, 1, emit)
            del cell
        except Exception as exc:
            emit({"kind": "error", "batch": batch, "ctx": ctx, "error": repr(exc)[:400]})
            traceback.print_exc()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    for q_len in (1,):
        try:
            emit({"kind": "fp8_agreement", "q_len": q_len, "ctx": ctx,
                  **bd.structured_agreement(q_len, ctx=ctx)})
        except Exception as exc:
            emit({"kind": "fp8_agreement_error", "q_len": q_len, "error": repr(exc)[:300]})
    log.close()


if __name__ == "__main__":
    main()
