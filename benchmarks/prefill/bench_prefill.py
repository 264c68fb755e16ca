"""MSA prefill on one GPU: fused indexer, top-k stage, sparse attention (tile vs per-token) vs cuDNN dense.

Usage (on the GPU machine, from the repo root):
    python3 benchmarks/prefill/bench_prefill.py --out DIR [--budget-s 300] [--sizes m3:32768,65536 ...]

Single-request causal prefill (no prefix), paged caches with a shuffled page table, bf16.
Index inputs are structured (tokens grouped in topic segments that recur, plus per-token noise), so
neighbouring tokens select overlapping blocks the way real text does; one row per shape uses i.i.d.
random inputs as the worst case for tile sharing. Timing: median of CUDA-event timed runs after a
warm-up run (compilation excluded), 256 MiB L2 flush before every run. FLOP conventions (MSA's):
indexer 2*d_idx*H_idx*causal_elements, sparse attention 4*d*(visible selected keys)*G summed over
(token, KV head), dense 4*d*Hq*causal_elements.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
DRY = "--dry-cpu" in sys.argv  # tiny sizes on the CPU through the Triton interpreter: checks the script only
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"
DEV = "cpu" if DRY else "cuda"

from kernels.indexer import msa_indexer  # noqa: E402
from kernels.indexer.op import _launch_indexer, indexer_block_scores_triton  # noqa: E402
from kernels.sparse_prefill import msa_prefill_attention  # noqa: E402
from kernels.sparse_prefill.op import _launch_tile, build_unions, default_tile_q  # noqa: E402
from kernels._common.tiles import tile_table  # noqa: E402

SHAPES = {  # Hq, Hkv, d, B, topk, d_idx
    "m3": dict(hq=64, hkv=4, d=128, block=128, topk=16, d_idx=128),
    "smollm2": dict(hq=9, hkv=3, d=64, block=64, topk=16, d_idx=64),
}
_FLUSH = None


def timed(fn, reps: int) -> float:
    """Median milliseconds of ``reps`` runs after one warm-up run, L2 flushed before each run."""
    global _FLUSH
    if DRY:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    if _FLUSH is None:
        _FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        _FLUSH.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def reps_for(est_ms: float) -> int:
    return int(max(3, min(15, 1500 / max(est_ms, 1e-3))))


def matmul_peak() -> float:
    n = 256 if DRY else 8192
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, 10)
    return 2 * n ** 3 / ms / 1e9


def run_info() -> tuple[float, dict]:
    """Measure the bf16 matmul peak and print the run's info line (GPU, torch, triton, peak): every script's start."""
    peak = matmul_peak()
    info = dict(gpu="cpu (dry run)" if DRY else torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, bf16_matmul_peak_tflops=round(peak, 1))
    print(json.dumps(info), flush=True)
    return peak, info


def run_cases(items: list[str], run_one, out_path: Path, info: dict, deadline: float | None = None) -> list[dict]:
    """Run `run_one(item) -> rows` for each item; a failing case is printed and skipped, not fatal;
    past `deadline` the rest are skipped; the rows so far are saved to `out_path` after every case."""
    rows: list[dict] = []
    for item in items:
        if deadline is not None and time.time() > deadline:
            print(f"skipped {item}: budget spent", flush=True)
            continue
        try:
            rows += run_one(item)
        except Exception:  # one failing case must not lose the others
            traceback.print_exc()
        if not DRY:
            torch.cuda.empty_cache()
        Path(out_path).write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    return rows


def make_inputs(t: int, shape: dict, structured: bool, seed: int = 0) -> dict:
    g = torch.Generator(device=DEV).manual_seed(seed)
    hq, hkv, d, block, d_idx = shape["hq"], shape["hkv"], shape["d"], shape["block"], shape["d_idx"]
    n_pages = -(-t // block)
    dev = DEV
    perm = torch.randperm(n_pages, device=dev, generator=g).to(torch.int32)[None]
    if structured:
        # topic segments of 256..4096 tokens drawn from 64 recurring topics
        seg_len = torch.randint(256, 4096, (t // 256 + 1,), device=dev, generator=g)
        seg_of_tok = torch.repeat_interleave(torch.arange(seg_len.numel(), device=dev), seg_len)[:t]
        topic_of_seg = torch.randint(0, 64, (seg_len.numel(),), device=dev, generator=g)
        topics = torch.randn(64, d_idx, device=dev, generator=g)
        base = topics[topic_of_seg[seg_of_tok]]
        k_idx = base + 0.7 * torch.randn(t, d_idx, device=dev, generator=g)
        head_mix = torch.randn(hkv, d_idx, d_idx, device=dev, generator=g) * 0.2 + torch.eye(d_idx, device=dev)
        q_idx = torch.einsum("td,hde->the", base, head_mix) + 0.7 * torch.randn(t, hkv, d_idx, device=dev, generator=g)
        del base
    else:
        k_idx = torch.randn(t, d_idx, device=dev, generator=g)
        q_idx = torch.randn(t, hkv, d_idx, device=dev, generator=g)
    k_idx_cache = torch.zeros(n_pages * block, d_idx, device=dev, dtype=torch.bfloat16)
    k_idx_cache[:t] = k_idx.to(torch.bfloat16)
    k_idx_cache = k_idx_cache.view(n_pages, block, d_idx)[torch.argsort(perm[0])].contiguous()
    kc = torch.randn(n_pages, hkv, block, d, device=dev, generator=g, dtype=torch.bfloat16)
    vc = torch.randn(n_pages, hkv, block, d, device=dev, generator=g, dtype=torch.bfloat16)
    q = torch.randn(t, hq, d, device=dev, generator=g, dtype=torch.bfloat16)
    return dict(q=q, q_idx=q_idx.to(torch.bfloat16).contiguous(), k_idx_cache=k_idx_cache, k_cache=kc,
                v_cache=vc, page_table=perm.contiguous(),
                cu_seqlens_q=torch.tensor([0, t], dtype=torch.int32, device=dev),
                seq_lens_kv=torch.tensor([t], dtype=torch.int32, device=dev))


def useful_attention_flops(ids: torch.Tensor, t: int, shape: dict) -> float:
    block = shape["block"]
    pos = torch.arange(t, device=ids.device)
    n_valid = (ids >= 0).sum(-1).double()  # [T, Hkv]
    keys = (n_valid - 1) * block + (pos % block + 1).double()[:, None]
    return 4.0 * shape["d"] * (shape["hq"] // shape["hkv"]) * keys.sum().item()


def bench_one(name: str, t: int, structured: bool, peak: float, deadline: float, dense_max: int,
              dense_single_max: int) -> list[dict]:
    shape = SHAPES[name]
    x = make_inputs(t, shape, structured)
    idx_args = (x["q_idx"], x["k_idx_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    att_args = (x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["cu_seqlens_q"], x["seq_lens_kv"])
    label = f"{name} T={t // 1024 if t >= 1024 else t}{'K' if t >= 1024 else ''} {'structured' if structured else 'random'}"
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
    t_idx = timed(lambda: msa_indexer(*idx_args, shape["topk"]), r)
    row("indexer fused (score+max+top-k)", t_idx, idx_flops)
    ids = msa_indexer(*idx_args, shape["topk"])
    t_score = timed(lambda: _launch_indexer(*idx_args, 4, mode=2), r)
    row("indexer score+max only (no top-k)", t_score, idx_flops)
    row("top-k stage inside fused kernel", max(t_idx - t_score, 1e-3), None, "fused minus score-only")
    if t == 65536 and structured or DRY:
        t_nb = timed(lambda: _launch_indexer(*idx_args, shape["topk"], mode=0, skip_unchanged=True), r)
        row("indexer fused, with tile-wide skip branch", t_nb, idx_flops, "ablation")
        t_nb = timed(lambda: _launch_indexer(*idx_args, shape["topk"], mode=0, num_stages=2), r)
        row("indexer fused, num_stages=2", t_nb, idx_flops, "ablation")
    if t * shape["hkv"] * (t // shape["block"]) * 4 <= 16e9:
        scores = indexer_block_scores_triton(*idx_args)
        t_topk = timed(lambda: torch.topk(scores, min(shape["topk"] - 1, scores.shape[-1]), dim=-1), reps_for(10))
        row("torch.topk(k-1) on materialised block scores", t_topk, None,
            f"ratio vs fused top-k stage {t_topk / max(t_idx - t_score, 1e-3):.1f}x; "
            f"{scores.numel() * 4 / t_topk / 1e6:.0f} GB/s")
        del scores
    att_flops = useful_attention_flops(ids, t, shape)
    group = shape["hq"] // shape["hkv"]
    if (t == 65536 and structured) or DRY:
        tq = default_tile_q(group)
        out_b = torch.empty_like(x["q"])
        lse_b = torch.empty(t, shape["hq"], device=DEV)
        for warps, stages in [(4, 2), (8, 3), (4, 3)]:
            t_cfg = timed(lambda: _launch_tile(*att_args, ids, out_b, lse_b, 1 / math.sqrt(shape["d"]), tq,
                                               num_warps=warps, num_stages=stages), reps_for(est / 2))
            row(f"attention tile TQ={tq} warps={warps} stages={stages}", t_cfg, att_flops,
                "config sweep (union build inside)")
        del out_b, lse_b
    for tq in ([8, 4] if group >= 8 else [16, 8, 32]):
        tr, ts = tile_table(x["cu_seqlens_q"], t, tq, longest_first=False)
        union, _, count = build_unions(ids, x["page_table"], x["cu_seqlens_q"], tr, ts, tq)
        mean_u = count[tr >= 0].float().mean().item()
        t_tile = timed(lambda: msa_prefill_attention(*att_args, ids, design="tile", tile_q=tq, check_ids=False),
                       reps_for(est / 2))
        row(f"attention tile-sharing TQ={tq}", t_tile, att_flops,
            f"mean union {mean_u:.1f} blocks per (tile, KV head)")
        if tq == (8 if group >= 8 else 16):
            t_tile_main = t_tile
            out_tile = msa_prefill_attention(*att_args, ids, design="tile", tile_q=tq, check_ids=False)[0]
            t_u = timed(lambda: build_unions(ids, x["page_table"], x["cu_seqlens_q"], tr, ts, tq), 5)
            row(f"  of which union build (Triton kernel) TQ={tq}", t_u, None)
        del union, count
    if t <= 262144:
        t_tok = timed(lambda: msa_prefill_attention(*att_args, ids, design="token", check_ids=False),
                      reps_for(est / 2))
        out_tok = msa_prefill_attention(*att_args, ids, design="token", check_ids=False)[0]
        diff = (out_tile.float() - out_tok.float()).abs().max().item()
        row("attention per-token", t_tok, att_flops, f"max|tile-token|={diff:.3g}")
        del out_tok
    del out_tile
    total = t_idx + t_tile_main
    row("MSA total = indexer + tile attention", total, None)
    dense_flops = 4 * shape["d"] * shape["hq"] * causal
    single = t > dense_max
    if (not single or t <= dense_single_max) and time.time() < deadline:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            q = x["q"].transpose(0, 1)[None].contiguous()
            k = x["k_cache"][x["page_table"][0].long()].permute(1, 0, 2, 3).reshape(shape["hkv"], -1, shape["d"])[:, :t]
            v = x["v_cache"][x["page_table"][0].long()].permute(1, 0, 2, 3).reshape(shape["hkv"], -1, shape["d"])[:, :t]
            k = k.repeat_interleave(group, 0)[None]
            v = v.repeat_interleave(group, 0)[None]
            del x
            with sdpa_kernel([SDPBackend.MATH if DRY else SDPBackend.CUDNN_ATTENTION]):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                if single:  # one cold run, no warm-up: a 1M dense prefill takes ~35 s
                    sync = (lambda: None) if DRY else torch.cuda.synchronize
                    sync()
                    start = time.perf_counter()
                    fn()
                    sync()
                    t_dense = (time.perf_counter() - start) * 1e3
                else:
                    t_dense = timed(fn, reps_for(dense_flops / 550e12 * 1e3))
            row("dense causal SDPA (cuDNN)", t_dense, dense_flops,
                f"MSA speed-up {t_dense / total:.1f}x" + ("; single cold run" if single else ""))
        except Exception:  # keep the sparse rows of this case
            traceback.print_exc()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--dry-cpu", action="store_true", help="tiny CPU run through the interpreter")
    ap.add_argument("--dense-max", type=int, default=262144, help="largest T timed with warm-up and repeats")
    ap.add_argument("--dense-single-max", type=int, default=0, help="larger T up to this get one cold dense run")
    ap.add_argument("--plan", default="m3:65536:s,m3:131072:s,m3:32768:s,smollm2:131072:s,m3:262144:s,"
                                      "m3:65536:r,m3:1048576:s,smollm2:32768:s")
    args = ap.parse_args()
    t0 = time.time()
    deadline = t0 + args.budget_s
    peak, info = run_info()

    def one(item: str) -> list[dict]:
        name, t, kind = item.split(":")
        return bench_one(name, int(t), kind == "s", peak, deadline, args.dense_max, args.dense_single_max)

    rows = run_cases(args.plan.split(","), one, Path(args.out, "bench.json"), info, deadline)
    print(f"total {time.time() - t0:.0f}s")
    for r in rows:
        print(f"{r['case']:<28} {r['stage']:<46} {r['ms']:>9.3f} ms {r['tflops'] or '':>7} "
              f"{r['frac_peak'] or '':>6} {r['note']}")


if __name__ == "__main__":
    main()
