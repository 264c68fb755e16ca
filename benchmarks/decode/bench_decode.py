"""MSA paged decode on one GPU: indexer, sparse attention, whole MSA step, our dense split-K decode and
SDPA over the full context, all timed as CUDA-graph replays in the same run.

M3 shape: Hq 64, Hkv 4, d 128, B 128, k 16, index 4 heads x 128. Every request of a cell has the
nominal context (uniform lengths). Cold cache: each timed graph cycles through ``n_rot`` disjoint
page sets (different page tables over one larger cache) so one cycle touches > 2x L2.
Bytes each kernel must read (the "achieved" column divides these by the median time):
indexer = history pages x B x d_idx x (2 bf16 | 1 + 4/d_idx fp8); sparse = visible tokens of the
selected pages x Hkv... per (token, group) x 2 (K and V) x d x 2; dense and SDPA = ctx x Hkv x 2 x d x 2.

    python benchmarks/decode/bench_decode.py --out DIR            # full grid (about 3 minutes on an H200)
    python benchmarks/decode/bench_decode.py --quick --out DIR    # two cells

The fp8 columns use the plan's default fp8 path (the fp8 x fp8 dot since run 3; run 1 widened keys to
bf16). Launch-knob sweeps: ``sweep_decode.py``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
if "--smoke-cpu" in sys.argv:  # must precede the first triton import
    os.environ["TRITON_INTERPRET"] = "1"
from kernels.decode import DenseDecodePlan, MSADecodePlan, quantize_index_keys  # noqa: E402

HQ, HKV, D, PAGE, TOPK, D_IDX = 64, 4, 128, 128, 16, 128
L2_BYTES = 60 << 20
GIB = 1 << 30
DEVICE = "cuda"  # --smoke-cpu switches to the CPU (Triton interpreter) to check the script itself


def graph_time(fns, min_graph_s=2e-3, max_calls=32, reps=10) -> float:
    """Median seconds per call of ``fns`` (one per rotation) replayed inside one CUDA graph."""
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - t0) / len(fns)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for f in fns:
            f()
        torch.cuda.synchronize()
        est = (time.perf_counter() - t0) / len(fns)
    torch.cuda.current_stream().wait_stream(side)
    calls = max(len(fns), min(max_calls, math.ceil(min_graph_s / max(est, 1e-6))))
    calls = len(fns) * math.ceil(calls / len(fns))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for j in range(calls):
            fns[j % len(fns)]()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth() -> dict:
    """Read + write bytes per second of a 2 GiB copy: memcpy (copy_) and an SM kernel (mul by 1)."""
    x = torch.randn(GIB, dtype=torch.bfloat16, device=DEVICE)
    y = torch.empty_like(x)
    t_memcpy = graph_time([lambda: y.copy_(x)], reps=10)
    t_kernel = graph_time([lambda: torch.mul(x, 1.0, out=y)], reps=10)
    del x, y
    return {"memcpy": 4 * GIB / t_memcpy, "kernel": 4 * GIB / t_kernel}


class Cell:
    """Paged caches for one (batch, ctx) with n_rot disjoint page tables."""

    def __init__(self, batch: int, ctx: int, n_rot: int, fp8: bool):
        self.batch, self.ctx, self.n_rot = batch, ctx, n_rot
        pages_per_req = -(-ctx // PAGE)
        num_pages = n_rot * batch * pages_per_req + 1
        dev = DEVICE
        self.k_cache = torch.randn(num_pages, HKV, PAGE, D, dtype=torch.bfloat16, device=dev)
        self.v_cache = torch.randn(num_pages, HKV, PAGE, D, dtype=torch.bfloat16, device=dev)
        self.k_idx = torch.randn(num_pages, PAGE, D_IDX, dtype=torch.bfloat16, device=dev)
        self.k8 = self.k8_scale = None
        if fp8:  # quantize in chunks: the fp32 temporaries of the whole cache would not fit at 200K x 128
            self.k8 = torch.empty(self.k_idx.shape, dtype=torch.float8_e4m3fn, device=dev)
            self.k8_scale = torch.empty(self.k_idx.shape[:2], dtype=torch.float32, device=dev)
            for i in range(0, num_pages, 4096):
                self.k8[i:i + 4096], self.k8_scale[i:i + 4096] = quantize_index_keys(self.k_idx[i:i + 4096])
        perm = torch.randperm(num_pages - 1, device=dev).to(torch.int32)
        self.tables = [perm[j * batch * pages_per_req:(j + 1) * batch * pages_per_req].view(batch, pages_per_req)
                       for j in range(n_rot)]
        self.seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)


def n_rotations(batch: int, ctx: int) -> int:
    sparse_bytes = batch * HKV * min(TOPK * PAGE, ctx) * 2 * D * 2
    return max(1, min(8, math.ceil(2.5 * L2_BYTES / sparse_bytes)))


def fits(batch, ctx, n_rot, free_bytes) -> bool:
    return n_rot * batch * ctx * (4 * HKV * D + 2 * D_IDX + D_IDX + 4) * 1.1 < free_bytes


def sparse_bytes(ids: torch.Tensor, seq_lens: torch.Tensor, q_len: int) -> tuple[int, int]:
    """(gathered bytes, unique bytes) of K+V the sparse attention must read for these selections."""
    tokens = ids.shape[0]
    pos = (seq_lens.long().repeat_interleave(q_len) - q_len + torch.arange(tokens, device=ids.device) % q_len)
    valid = ids >= 0
    own = (pos // PAGE)[:, None, None]
    full_pages = (valid & (ids.long() != own)).sum().item()
    local_tokens = ((pos % PAGE) + 1)[:, None].expand(-1, ids.shape[1]).sum().item()
    per_tok = 2 * D * 2
    gathered = (full_pages * PAGE + local_tokens) * per_tok
    req = (torch.arange(tokens, device=ids.device) // q_len)[:, None, None].expand_as(ids)
    head = torch.arange(ids.shape[1], device=ids.device)[None, :, None].expand_as(ids)
    key = (req.long() * HKV + head) * (1 << 20) + ids.long()
    unique = torch.unique(key[valid]).numel() * PAGE * per_tok
    return gathered, unique


def bench_paged(cell: Cell, q_len: int, with_fp8: bool) -> dict:
    tokens = cell.batch * q_len
    q = torch.randn(tokens, HQ, D, dtype=torch.bfloat16, device=DEVICE)
    q_idx = torch.randn(tokens, HKV, D_IDX, dtype=torch.bfloat16, device=DEVICE)
    msa, dense = [], []
    for table in cell.tables:
        m = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device=DEVICE)
        m.plan(cell.seq_lens, table, q_len)
        d = DenseDecodePlan(HQ, HKV, D, PAGE, device=DEVICE)
        d.plan(cell.seq_lens, table, q_len)
        msa.append(m)
        dense.append(d)
    res = {"batch": cell.batch, "ctx": cell.ctx, "q_len": q_len, "n_rot": cell.n_rot,
           "index_splits": msa[0].index_splits, "attn_splits": msa[0].attn_splits,
           "dense_splits": dense[0].attn_splits}
    res["indexer_s"] = graph_time([lambda m=m: m.run_indexer(q_idx, cell.k_idx) for m in msa])
    if with_fp8:
        res["indexer_fp8_s"] = graph_time([lambda m=m: m.run_indexer(q_idx, cell.k8, cell.k8_scale) for m in msa])
    for m in msa:
        m.run_indexer(q_idx, cell.k_idx)
    res["sparse_s"] = graph_time([lambda m=m: m.run_attention(q, cell.k_cache, cell.v_cache) for m in msa])
    res["msa_step_s"] = graph_time(
        [lambda m=m: m.run(q, q_idx, cell.k_cache, cell.v_cache, cell.k_idx) for m in msa])
    if with_fp8:
        res["msa_step_fp8_s"] = graph_time(
            [lambda m=m: m.run(q, q_idx, cell.k_cache, cell.v_cache, cell.k8, cell.k8_scale) for m in msa])
    res["dense_s"] = graph_time([lambda d=d: d.run(q, cell.k_cache, cell.v_cache) for d in dense])
    hist_pages = cell.batch * ((cell.ctx - 1) // PAGE)
    res["indexer_bytes"] = hist_pages * PAGE * D_IDX * 2
    res["indexer_fp8_bytes"] = hist_pages * PAGE * (D_IDX + 4)
    res["sparse_bytes"], res["sparse_unique_bytes"] = sparse_bytes(msa[0].topk_ids, cell.seq_lens, q_len)
    res["dense_bytes"] = cell.batch * cell.ctx * HKV * 2 * D * 2
    return res


def bench_sdpa(batch: int, ctx: int, q_len: int) -> float | None:
    """Full-context SDPA (enable_gqa, no mask: q_len extra keys do not change the cost)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    n_rot = max(1, min(4, math.ceil(2.5 * L2_BYTES / (batch * ctx * HKV * D * 4))))
    ks = [torch.randn(batch, HKV, ctx, D, dtype=torch.bfloat16, device=DEVICE) for _ in range(n_rot)]
    vs = [torch.randn_like(k) for k in ks]
    q = torch.randn(batch, HQ, q_len, D, dtype=torch.bfloat16, device=DEVICE)
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]

    def call(j):
        with sdpa_kernel(backends):
            torch.nn.functional.scaled_dot_product_attention(q, ks[j], vs[j], enable_gqa=True)

    try:
        return graph_time([lambda j=j: call(j) for j in range(n_rot)])
    finally:
        del ks, vs


def structured_agreement(q_len: int, batch: int = 8, ctx: int = 131072, seed: int = 0) -> dict:
    """Selection agreement of fp8 vs bf16 index keys: random keys, and keys with planted matches
    (per request and index head 24 pages get one token aligned with the head's query direction,
    strength varied; the request's q_len queries share that direction plus noise)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    cell = Cell(batch, ctx, 1, fp8=False)
    base = torch.randn(batch, HKV, D_IDX, device=DEVICE, generator=gen)
    q_idx = (base[:, None] + 0.3 * torch.randn(batch, q_len, HKV, D_IDX, device=DEVICE, generator=gen))
    q_idx = q_idx.reshape(batch * q_len, HKV, D_IDX).to(torch.bfloat16)
    out = {}
    for name in ("random", "structured"):
        keys = cell.k_idx.clone()
        if name == "structured":
            unit = base / base.norm(dim=-1, keepdim=True)
            n_hist = (ctx - q_len) // PAGE
            for r in range(batch):
                for h in range(HKV):
                    n_plant = min(24, n_hist)
                    pages = torch.randperm(n_hist, device=DEVICE, generator=gen)[:n_plant]
                    phys = cell.tables[0][r, pages].long()
                    tok = torch.randint(0, PAGE, (n_plant,), device=DEVICE, generator=gen)
                    strength = 2.0 + 4.0 * torch.rand(n_plant, 1, device=DEVICE, generator=gen)
                    keys[phys, tok] = (strength * unit[r, h] * math.sqrt(D_IDX)).to(keys.dtype)
        k8, scale = quantize_index_keys(keys)
        plan = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device=DEVICE)
        plan.plan(cell.seq_lens, cell.tables[0], q_len)
        ref = plan.run_indexer(q_idx, keys).clone()
        hist_ref = ref[..., : TOPK - 1].long()
        for suffix, fp8_dot in (("", False), ("_fp8_dot", True)):
            plan8 = MSADecodePlan(HQ, HKV, D, PAGE, topk=TOPK, index_dim=D_IDX, device=DEVICE,
                                  index_fp8_dot=fp8_dot)
            plan8.plan(cell.seq_lens, cell.tables[0], q_len)
            hist_got = plan8.run_indexer(q_idx, k8, scale)[..., : TOPK - 1].long()
            out[name + suffix] = (hist_got[..., :, None] == hist_ref[..., None, :]).any(-1).float().mean().item()
    del cell
    return out


def fmt_us(s):
    return "-" if s is None else f"{s * 1e6:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--fp8-focus", action="store_true", help="q_len 1, ctx >= 32K, no SDPA: fp8 index keys")
    ap.add_argument("--smoke-cpu", action="store_true", help="tiny sizes on the CPU interpreter (script check)")
    args = ap.parse_args()
    global DEVICE
    if args.smoke_cpu:
        DEVICE = "cpu"
        pass
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "bench_decode.jsonl")
    log = open(log_path, "w")

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
        cb = copy_bandwidth()
        emit({"kind": "copy", "bytes_per_s": max(cb.values()), **cb})
    batches = [8, 64] if args.quick else [8, 32, 64, 128]
    ctxs = [4096, 131072] if args.quick else [4096, 32768, 131072, 204800]
    agree_ctx = 131072
    if args.smoke_cpu:
        batches, ctxs, agree_ctx = [2], [300, 2200], 2200
    grid = [(b, c) for b in batches for c in ctxs]
    if args.fp8_focus:
        ctxs = [32768, 131072, 204800]
        grid = [(b, c) for b in batches for c in ctxs]
    if not (args.quick or args.smoke_cpu or args.fp8_focus):
        grid += [(b, c) for b in (8, 64) for c in (1024, 2048, 3072, 6144, 8192, 16384)]
    for batch, ctx in grid:
        n_rot = n_rotations(batch, ctx)
        free = torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else 8 * GIB
        if not fits(batch, ctx, n_rot, free):
            emit({"kind": "skip", "batch": batch, "ctx": ctx, "reason": "does not fit"})
            continue
        main_grid = ctx in ctxs
        try:
            cell = Cell(batch, ctx, n_rot, fp8=main_grid)
            for q_len in ((1, 8) if main_grid and not args.fp8_focus else (1,)):
                rec = bench_paged(cell, q_len, with_fp8=main_grid)
                emit({"kind": "paged", **rec})
            del cell
        except Exception as exc:  # keep going: one failing cell must not lose the rest
            emit({"kind": "error", "batch": batch, "ctx": ctx, "error": repr(exc)[:400]})
            traceback.print_exc()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        if main_grid and DEVICE == "cuda" and not args.fp8_focus:
            for q_len in (1, 8):
                try:
                    emit({"kind": "sdpa", "batch": batch, "ctx": ctx, "q_len": q_len,
                          "sdpa_s": bench_sdpa(batch, ctx, q_len)})
                except Exception as exc:
                    emit({"kind": "sdpa_error", "batch": batch, "ctx": ctx, "q_len": q_len,
                          "error": repr(exc)[:300]})
                torch.cuda.empty_cache()
    for q_len in (1, 8):
        try:
            emit({"kind": "fp8_agreement", "q_len": q_len, "ctx": agree_ctx,
                  **structured_agreement(q_len, ctx=agree_ctx)})
        except Exception as exc:
            emit({"kind": "fp8_agreement_error", "q_len": q_len, "error": repr(exc)[:300]})
    log.close()


if __name__ == "__main__" and "--summarize" not in sys.argv:
    main()


def summarize(jsonl_path: str) -> str:
    """Markdown tables from a bench_decode.jsonl log."""
    recs = [json.loads(line) for line in open(jsonl_path)]
    env = next(r for r in recs if r["kind"] == "env")
    bw = next((r["bytes_per_s"] for r in recs if r["kind"] == "copy"), float("nan"))
    sdpa = {(r["batch"], r["ctx"], r["q_len"]): r["sdpa_s"] for r in recs if r["kind"] == "sdpa"}
    paged = [r for r in recs if r["kind"] == "paged"]
    lines = [f"GPU {env['gpu']} ({env['sms']} SMs), torch {env['torch']}, triton {env['triton']}, "
             f"CUDA {env['cuda']}; measured copy bandwidth {bw / 1e12:.2f} TB/s (read + write).", ""]

    def rate(nbytes, s):
        return f"{nbytes / s / 1e12:.2f} ({100 * nbytes / s / bw:.0f}%)"

    main_ctx = sorted({r["ctx"] for r in paged if "indexer_fp8_s" in r})
    for q_len in (1, 8):
        lines += [f"### q_len = {q_len}", "",
                  "| batch | ctx | indexer bf16 us (TB/s, % copy) | indexer fp8 us (TB/s) | sparse attn us "
                  "(TB/s gathered, % copy) | MSA step us | dense ours us (TB/s, % copy) | SDPA us (TB/s) | "
                  "dense / MSA | SDPA / MSA |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in paged:
            if r["q_len"] != q_len or r["ctx"] not in main_ctx:
                continue
            sd = sdpa.get((r["batch"], r["ctx"], q_len))
            sd_cell = "-" if sd is None else f"{fmt_us(sd)} ({r['dense_bytes'] / sd / 1e12:.2f})"
            sd_ratio = "-" if sd is None else f"{sd / r['msa_step_s']:.2f}x"
            fp8_rate = r["indexer_fp8_bytes"] / r["indexer_fp8_s"] / 1e12
            lines.append(
                f"| {r['batch']} | {r['ctx'] // 1024}K "
                f"| {fmt_us(r['indexer_s'])} ({rate(r['indexer_bytes'], r['indexer_s'])}) "
                f"| {fmt_us(r['indexer_fp8_s'])} ({fp8_rate:.2f}) "
                f"| {fmt_us(r['sparse_s'])} ({rate(r['sparse_bytes'], r['sparse_s'])}) | {fmt_us(r['msa_step_s'])} "
                f"| {fmt_us(r['dense_s'])} ({rate(r['dense_bytes'], r['dense_s'])}) "
                f"| {sd_cell} | {r['dense_s'] / r['msa_step_s']:.2f}x | {sd_ratio} |")
        lines.append("")
    lines += ["### Break-even (q_len = 1): dense ours / MSA step", "", "| batch | " + " | ".join(
        f"{c // 1024}K" if c >= 1024 else str(c) for c in sorted({r['ctx'] for r in paged})) + " |"]
    ctx_all = sorted({r["ctx"] for r in paged})
    lines.append("| --- " * (len(ctx_all) + 1) + "|")
    for b in sorted({r["batch"] for r in paged}):
        row = {r["ctx"]: r["dense_s"] / r["msa_step_s"] for r in paged if r["batch"] == b and r["q_len"] == 1}
        lines.append(f"| {b} | " + " | ".join(f"{row[c]:.2f}x" if c in row else "-" for c in ctx_all) + " |")
    lines.append("")
    for r in recs:
        if r["kind"] in ("fp8_agreement", "skip", "error", "sdpa_error", "fp8_agreement_error"):
            lines.append(f"- {json.dumps(r)}")
    return "\n".join(lines)


if __name__ == "__main__" and "--summarize" in sys.argv:
    print(summarize(sys.argv[sys.argv.index("--summarize") + 1]))
