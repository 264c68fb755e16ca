"""MSA paged decode on one GPU through the public plans (``MSADecodePlan``, ``DenseDecodePlan``): the
indexer with bf16 and with fp8 index keys, sparse attention, the whole MSA step, and our dense split-K
paged decode, all timed as CUDA-graph replays in the same call.

Method (as the RESULTS rows were measured): every request at the nominal context (uniform lengths),
random N(0, 1) data, scattered page tables, bf16 K/V. Each time is the median of 10 replays of one CUDA
graph (after 3 warm-up replays) divided by the calls it holds (enough for >= 2 ms per replay, at most
32). Cold cache: the calls cycle through ``n_rot`` disjoint page sets (different page tables over one
larger cache), so one cycle touches >= 2.5 x L2 of sparse-attention bytes (up to 8 sets). Ceiling: the
copy bandwidth of an SM kernel (``torch.mul(x, 1, out=y)`` on 2 GiB, read + write) measured in the
same call. Bytes each kernel must read (the ``pct_copy`` columns divide them by time and ceiling):
indexer = history pages x B x d_idx x 2 (fp8: x (d_idx + 4) / 2); sparse = the visible tokens of the
selected pages x K and V x d x 2 per (token, KV group); dense = ctx x Hkv x K and V x d x 2. The fp8
keys take the plan's fp8 path (e4m3 x e4m3 dot). The ``agreement`` rows give the share of the bf16 run's
history pages that fp8 keys also pick, on random keys and on keys with planted matches.

The ``fp8`` preset (FP8 K/V, issue 22) times in one call, per batch: the MSA step (indexer + sparse
attention) with bf16 K/V and bf16 index keys, with fp8 K/V (bf16 index keys), and with fp8 K/V and fp8
or int8 index keys (``kernels/_common/int8.py``: the same bytes, closer selections); the sparse attention
alone and our dense decode with bf16 K/V, fp8 K/V widened to fp16 (the
plan's default) and fp8 K/V on the e4m3 x e4m3 dots (``kv_fp8_dot=True``), and on a GPU the fp8 attention
at other pipeline depths (``_stagesN``; the plan's choice: ``plan.FP8_ATTN_STAGES``). Ratios are
bf16 time / fp8 time (goal: MSA step >= 1.7x); bandwidth counts the bytes actually read: fp8 K/V = tokens x
(K and V x d x 1 + two fp32 scales).

On the CPU (``TRITON_INTERPRET=1``) the ``ci`` and ``fp8ci`` presets run the same code on tiny shapes,
timing the calls on the host (the plans take the torch references there).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.kernels.prefill import Shape
from kernels._common.fp8 import FP8, quantize_rows
from kernels.decode import DecodeTuning, DenseDecodePlan, MSADecodePlan, quantize_index_keys, quantize_int8_rows

GIB = 1 << 30
L2_BYTES = 60 << 20  # the L2 size the cold-cache rotation assumes (H200)
FP8_STAGE_SWEEP = (2, 4, 6)  # fp8 preset: attention pipeline depths timed beside the plan's choice (GPU only)


SHAPES = {
    "m3": Shape(hq=64, hkv=4, d=128, block=128, topk=16, d_idx=128),  # MiniMax M3's attention
    "tiny": Shape(hq=8, hkv=2, d=64, block=64, topk=4, d_idx=64),
}


@dataclass(frozen=True)
class Preset:
    doc: str
    shape: str
    batches: tuple[int, ...]
    ctx: int
    q_len: int = 1
    agreement: bool = False  # add the fp8-vs-bf16 selection agreement rows (first batch)
    timing: bool = True
    fp8_kv: bool = False  # the FP8 K/V rows (fp8_row) instead of the bf16 timing rows


PRESETS = {
    "headline": Preset("the README's decode rows: M3 at 128K, batch 8 / 32 / 64 / 128, q_len 1", "m3",
                       (8, 32, 64, 128), 131072),
    "b64": Preset("the headline row at batch 64", "m3", (64,), 131072),
    "mtp": Preset("M3 at 128K with q_len 8 (one token + 7 drafts), batch 8 / 64", "m3", (8, 64), 131072, q_len=8),
    "agreement": Preset("fp8 vs bf16 index keys: selection agreement, M3, batch 8, 128K", "m3", (8,), 131072,
                        agreement=True, timing=False),
    "ci": Preset("tiny shapes under TRITON_INTERPRET=1 on the CPU (checks the runner)", "tiny", (2,), 2200,
                 agreement=True),
    "fp8": Preset("FP8 K/V against bf16: MSA step, sparse and dense decode, M3 at 128K, batch 64", "m3", (64,),
                  131072, fp8_kv=True),
    "fp8mtp": Preset("the fp8 preset with q_len 8 (dense tiles of 128 rows: e4m3 wgmma), M3, 128K, batch 64", "m3",
                     (64,), 131072, q_len=8, fp8_kv=True),
    "fp8ci": Preset("the fp8 preset on tiny shapes on the CPU (checks the runner)", "tiny", (2,), 2200,
                    fp8_kv=True),
}


def graph_time(fns, cuda: bool, min_graph_s: float = 2e-3, max_calls: int = 32, reps: int = 10) -> float:
    """Median seconds per call of ``fns`` (one per page set) replayed inside one CUDA graph."""
    if not cuda:
        for f in fns:
            f()
        t0 = time.perf_counter()
        for f in fns:
            f()
        return (time.perf_counter() - t0) / len(fns)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compilation) outside the capture, then an estimate
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
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes per second (read + write) of an SM copy kernel over 2 GiB."""
    x = torch.randn(GIB, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    t = graph_time([lambda: torch.mul(x, 1.0, out=y)], cuda=True)
    return 4 * GIB / t


def _chunked(quantize, x: torch.Tensor, dtype: torch.dtype, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize(x)`` (codes ``dtype``, fp32 scale per row) ``chunk`` pages at a time: the fp32 temporaries of a
    whole 128K x batch 128 cache would not fit."""
    codes = torch.empty(x.shape, dtype=dtype, device=x.device)
    scale = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    for i in range(0, x.shape[0], chunk):
        codes[i:i + chunk], scale[i:i + chunk] = quantize(x[i:i + chunk])
    return codes, scale


class Cell:
    """Paged caches for one (batch, ctx): bf16 and fp8 index keys (``fp8_kv``: fp8 K/V and int8 index keys too),
    ``n_rot`` disjoint page tables."""

    def __init__(self, s: Shape, batch: int, ctx: int, n_rot: int, dev: str, seed: int = 0, fp8_kv: bool = False):
        gen = torch.Generator(device=dev).manual_seed(seed)
        pages_per_req = -(-ctx // s.block)
        num_pages = n_rot * batch * pages_per_req + 1

        def rnd(*shape):
            return torch.randn(*shape, generator=gen, device=dev, dtype=torch.bfloat16)

        self.k_cache, self.v_cache = rnd(num_pages, s.hkv, s.block, s.d), rnd(num_pages, s.hkv, s.block, s.d)
        self.k_idx = rnd(num_pages, s.block, s.d_idx)
        self.k8, self.k8_scale = _chunked(quantize_index_keys, self.k_idx, FP8, 4096)
        if fp8_kv:  # e4m3 K/V + fp32 scales [P, Hkv, B] by the shared rule; int8 index keys
            self.ki8, self.ki8_scale = _chunked(quantize_int8_rows, self.k_idx, torch.int8, 4096)
            self.kv8 = [t for c in (self.k_cache, self.v_cache) for t in _chunked(quantize_rows, c, FP8, 1024)]
        perm = torch.randperm(num_pages - 1, generator=gen, device=dev).to(torch.int32)
        n = batch * pages_per_req
        self.tables = [perm[j * n:(j + 1) * n].view(batch, pages_per_req) for j in range(n_rot)]
        self.seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)


def n_rotations(s: Shape, batch: int, ctx: int, cuda: bool) -> int:
    """Page sets per timed cycle: >= 2.5 x L2 of sparse-attention bytes, 1..8."""
    if not cuda:
        return 1
    sparse = batch * s.hkv * min(s.topk * s.block, ctx) * 2 * s.d * 2
    return max(1, min(8, math.ceil(2.5 * L2_BYTES / sparse)))


def sparse_bytes(s: Shape, ids: torch.Tensor, seq_lens: torch.Tensor, q_len: int) -> int:
    """K + V bytes the sparse attention reads for these selections, per (token, KV group)."""
    tokens = ids.shape[0]
    pos = seq_lens.long().repeat_interleave(q_len) - q_len + torch.arange(tokens, device=ids.device) % q_len
    own = (pos // s.block)[:, None, None]
    full_pages = ((ids >= 0) & (ids.long() != own)).sum().item()
    own_tokens = ((pos % s.block) + 1).sum().item() * ids.shape[1]
    return (full_pages * s.block + own_tokens) * 2 * s.d * 2


def timing_row(s: Shape, batch: int, ctx: int, q_len: int, cuda: bool, copy_bw: float | None) -> dict:
    dev = "cuda" if cuda else "cpu"
    cell = Cell(s, batch, ctx, n_rotations(s, batch, ctx, cuda), dev)
    tokens = batch * q_len
    q = torch.randn(tokens, s.hq, s.d, dtype=torch.bfloat16, device=dev)
    q_idx = torch.randn(tokens, s.hkv, s.d_idx, dtype=torch.bfloat16, device=dev)
    dims = (s.hq, s.hkv, s.d, s.block)

    def plans(cls, **kw):
        out = []
        for table in cell.tables:
            p = cls(*dims, device=dev, **kw)
            p.plan(cell.seq_lens, table, q_len)
            out.append(p)
        return out

    msa = plans(MSADecodePlan, topk=s.topk, index_dim=s.d_idx)
    msa8 = plans(MSADecodePlan, topk=s.topk, index_dim=s.d_idx, index_dtype=torch.float8_e4m3fn)
    dense = plans(DenseDecodePlan)
    kc, vc = cell.k_cache, cell.v_cache
    t_idx = graph_time([lambda m=m: m.run_indexer(q_idx, cell.k_idx) for m in msa], cuda)
    t_idx8 = graph_time([lambda m=m: m.run_indexer(q_idx, cell.k8, cell.k8_scale) for m in msa8], cuda)
    for m in msa:
        m.run_indexer(q_idx, cell.k_idx)  # the selections the sparse attention reads
    t_sparse = graph_time([lambda m=m: m.run_attention(q, kc, vc) for m in msa], cuda)
    t_step = graph_time([lambda m=m: m.run(q, q_idx, kc, vc, cell.k_idx) for m in msa], cuda)
    t_step8 = graph_time([lambda m=m: m.run(q, q_idx, kc, vc, cell.k8, cell.k8_scale) for m in msa8], cuda)
    t_dense = graph_time([lambda p=p: p.run(q, kc, vc) for p in dense], cuda)
    hist_pages = batch * ((ctx - 1) // s.block)

    def pct(n_bytes: int, t: float) -> float | None:
        return round(100 * n_bytes / t / copy_bw, 1) if copy_bw else None

    row = dict(batch=batch, ctx=ctx, q_len=q_len)
    for name, t, n_bytes in (("indexer_bf16", t_idx, hist_pages * s.block * s.d_idx * 2),
                             ("indexer_fp8", t_idx8, hist_pages * s.block * (s.d_idx + 4)),
                             ("sparse", t_sparse, sparse_bytes(s, msa[0].topk_ids, cell.seq_lens, q_len))):
        row[f"{name}_us"], row[f"{name}_pct_copy"] = round(t * 1e6, 1), pct(n_bytes, t)
    row.update(step_bf16_us=round(t_step * 1e6, 1), step_fp8_us=round(t_step8 * 1e6, 1),
               dense_us=round(t_dense * 1e6, 1), dense_pct_copy=pct(batch * ctx * s.hkv * 2 * s.d * 2, t_dense),
               speedup_bf16=f"{t_dense / t_step:.2f}x", speedup_fp8=f"{t_dense / t_step8:.2f}x",
               splits=f"index {msa[0].indexer_launch.splits}, sparse {msa[0].attention_launch.splits}, "
                      f"dense {dense[0].attention_launch.splits}",
               copy_tb_s=round(copy_bw / 1e12, 2) if copy_bw else None)
    return row


def fp8_row(s: Shape, batch: int, ctx: int, q_len: int, cuda: bool, copy_bw: float | None) -> dict:
    """bf16 vs fp8 K/V in one call: MSA step, sparse attention, dense decode (see the module docstring)."""
    dev = "cuda" if cuda else "cpu"
    cell = Cell(s, batch, ctx, n_rotations(s, batch, ctx, cuda), dev, fp8_kv=True)
    tokens = batch * q_len
    q = torch.randn(tokens, s.hq, s.d, dtype=torch.bfloat16, device=dev)
    q_idx = torch.randn(tokens, s.hkv, s.d_idx, dtype=torch.bfloat16, device=dev)
    dims = (s.hq, s.hkv, s.d, s.block)
    kc, vc = cell.k_cache, cell.v_cache
    k8, ks, v8, vs = cell.kv8
    fp8 = dict(k_scale=ks, v_scale=vs)

    def plans(cls, **kw):
        out = []
        for table in cell.tables:
            p = cls(*dims, device=dev, **kw)
            p.plan(cell.seq_lens, table, q_len)
            out.append(p)
        return out

    idx = dict(topk=s.topk, index_dim=s.d_idx)
    msa = plans(MSADecodePlan, **idx)
    msa8 = plans(MSADecodePlan, **idx, kv_dtype=FP8)
    msa8d = plans(MSADecodePlan, **idx, kv_dtype=FP8, kv_fp8_dot=True)
    msa88 = plans(MSADecodePlan, **idx, kv_dtype=FP8, index_dtype=FP8)
    msa8i = plans(MSADecodePlan, **idx, kv_dtype=FP8, index_dtype=torch.int8)
    times = {
        "step_bf16": [lambda m=m: m.run(q, q_idx, kc, vc, cell.k_idx) for m in msa],
        "step_fp8kv": [lambda m=m: m.run(q, q_idx, k8, v8, cell.k_idx, **fp8) for m in msa8],
        "step_fp8kv_fp8idx": [lambda m=m: m.run(q, q_idx, k8, v8, cell.k8, cell.k8_scale, **fp8) for m in msa88],
        "step_fp8kv_int8idx": [lambda m=m: m.run(q, q_idx, k8, v8, cell.ki8, cell.ki8_scale, **fp8) for m in msa8i],
    }
    t = {name: graph_time(fns, cuda) for name, fns in times.items()}
    for group in (msa, msa8, msa8d):
        for m in group:
            m.run_indexer(q_idx, cell.k_idx)  # the selections the sparse attention reads
    t["sparse_bf16"] = graph_time([lambda m=m: m.run_attention(q, kc, vc) for m in msa], cuda)
    t["sparse_fp8"] = graph_time([lambda m=m: m.run_attention(q, k8, v8, **fp8) for m in msa8], cuda)
    t["sparse_fp8dot"] = graph_time([lambda m=m: m.run_attention(q, k8, v8, **fp8) for m in msa8d], cuda)
    for name, kw in (("dense_bf16", {}), ("dense_fp8", dict(kv_dtype=FP8)),
                     ("dense_fp8dot", dict(kv_dtype=FP8, kv_fp8_dot=True))):
        group = plans(DenseDecodePlan, **kw)
        caches, scales = ((k8, v8), fp8) if kw else ((kc, vc), {})
        t[name] = graph_time([lambda p=p, c=caches, sc=scales: p.run(q, *c, **sc) for p in group], cuda)
        del group
    # pipeline depth: an fp8 page is half the bytes, so the same stages keep half as many bytes in flight
    for stages in FP8_STAGE_SWEEP if cuda else ():
        group = plans(MSADecodePlan, **idx, kv_dtype=FP8, tuning=DecodeTuning(attn_stages=stages))
        for m in group:
            m.run_indexer(q_idx, cell.k_idx)
        t[f"sparse_fp8_stages{stages}"] = graph_time([lambda m=m: m.run_attention(q, k8, v8, **fp8) for m in group],
                                                     cuda)
        group = plans(DenseDecodePlan, kv_dtype=FP8, tuning=DecodeTuning(attn_stages=stages))
        t[f"dense_fp8_stages{stages}"] = graph_time([lambda p=p: p.run(q, k8, v8, **fp8) for p in group], cuda)
    sparse_b16 = sparse_bytes(s, msa[0].topk_ids, cell.seq_lens, q_len)
    sparse_b8 = sparse_b16 // 2 + sparse_b16 // (2 * s.d) * 4  # d bytes -> d / 2 bytes and a 4-byte scale
    dense_tok = batch * ctx * s.hkv * 2  # K and V rows read
    n_bytes = {"sparse_bf16": sparse_b16, "sparse_fp8": sparse_b8, "sparse_fp8dot": sparse_b8,
               "dense_bf16": dense_tok * s.d * 2, "dense_fp8": dense_tok * (s.d + 4),
               "dense_fp8dot": dense_tok * (s.d + 4)}
    for stages in FP8_STAGE_SWEEP:
        n_bytes[f"sparse_fp8_stages{stages}"] = sparse_b8
        n_bytes[f"dense_fp8_stages{stages}"] = dense_tok * (s.d + 4)
    row: dict = dict(batch=batch, ctx=ctx, q_len=q_len)
    for name, sec in t.items():
        row[f"{name}_us"] = round(sec * 1e6, 1)
        if name in n_bytes:
            row[f"{name}_tb_s"] = round(n_bytes[name] / sec / 1e12, 2)
            row[f"{name}_pct_copy"] = round(100 * n_bytes[name] / sec / copy_bw, 1) if copy_bw else None
    for name in ("step_fp8kv", "step_fp8kv_fp8idx", "step_fp8kv_int8idx", "sparse_fp8", "sparse_fp8dot", "dense_fp8",
                 "dense_fp8dot"):
        base = "step_bf16" if name.startswith("step") else name.split("_fp8")[0] + "_bf16"
        row[f"ratio_{name}"] = f"{t[base] / t[name]:.2f}x"
    row.update(goal_step_1_7x=t["step_bf16"] / t["step_fp8kv_fp8idx"] >= 1.7,
               goal_step_1_7x_int8idx=t["step_bf16"] / t["step_fp8kv_int8idx"] >= 1.7,
               splits=f"sparse {msa8[0].attention_launch.splits}",
               copy_tb_s=round(copy_bw / 1e12, 2) if copy_bw else None)
    return row


def agreement_rows(s: Shape, batch: int, ctx: int, cuda: bool, seed: int = 0) -> list[dict]:
    """Share of the bf16 run's k-1 history pages that fp8 keys also select (both fp8 paths), on random
    keys and on structured ones: per request and index head 24 pages get one token aligned with the
    head's query direction (strength 2-6 x sqrt(d_idx)); the request's queries share it plus noise."""
    dev = "cuda" if cuda else "cpu"
    gen = torch.Generator(device=dev).manual_seed(seed)
    cell = Cell(s, batch, ctx, 1, dev, seed)
    table = cell.tables[0]
    n_hist = (ctx - 1) // s.block
    rows = []
    for q_len in (1, 8):
        base = torch.randn(batch, s.hkv, s.d_idx, device=dev, generator=gen)
        q_idx = base[:, None] + 0.3 * torch.randn(batch, q_len, s.hkv, s.d_idx, device=dev, generator=gen)
        q_idx = q_idx.reshape(batch * q_len, s.hkv, s.d_idx).to(torch.bfloat16)
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        for inputs in ("random", "structured"):
            keys = cell.k_idx.clone()
            if inputs == "structured":
                unit = base / base.norm(dim=-1, keepdim=True)
                n_plant = min(24, n_hist)
                for r in range(batch):
                    for h in range(s.hkv):
                        phys = table[r, torch.randperm(n_hist, device=dev, generator=gen)[:n_plant]].long()
                        tok = torch.randint(0, s.block, (n_plant,), device=dev, generator=gen)
                        strength = 2.0 + 4.0 * torch.rand(n_plant, 1, device=dev, generator=gen)
                        keys[phys, tok] = (strength * unit[r, h] * math.sqrt(s.d_idx)).to(keys.dtype)
            k8, scale = quantize_index_keys(keys)
            plan = MSADecodePlan(s.hq, s.hkv, s.d, s.block, topk=s.topk, index_dim=s.d_idx, device=dev)
            plan.plan(seq_lens, table, q_len)
            want = plan.run_indexer(q_idx, keys)[..., : s.topk - 1].long()
            row = dict(batch=batch, ctx=ctx, q_len=q_len, inputs=inputs)
            for name, fp8_dot in (("agree_fp16_dot", False), ("agree_fp8_dot", True)):
                plan8 = MSADecodePlan(s.hq, s.hkv, s.d, s.block, topk=s.topk, index_dim=s.d_idx, device=dev,
                                      index_dtype=torch.float8_e4m3fn, index_fp8_dot=fp8_dot)
                plan8.plan(seq_lens, table, q_len)
                got = plan8.run_indexer(q_idx, k8, scale)[..., : s.topk - 1].long()
                row[name] = round((got[..., :, None] == want[..., None, :]).any(-1).float().mean().item(), 4)
            rows.append(row)
    return rows


def run(preset: str) -> list[dict]:
    """The preset's rows (each printed as it is done)."""
    p, cuda = PRESETS[preset], torch.cuda.is_available()
    s = SHAPES[p.shape]
    copy_bw = copy_bandwidth() if cuda and p.timing else None
    rows: list[dict] = []
    for batch in p.batches if p.timing else ():
        row_fn = fp8_row if p.fp8_kv else timing_row
        rows.append(row_fn(s, batch, p.ctx, p.q_len, cuda, copy_bw))
        print(rows[-1], flush=True)
        if cuda:
            torch.cuda.empty_cache()
    if p.agreement:
        rows += agreement_rows(s, p.batches[0], p.ctx, cuda)
        print(rows[-4:], flush=True)
    return rows


if __name__ == "__main__":  # the same as `python -m benchmarks.kernels.run --op decode ...`
    import sys

    from benchmarks.kernels.run import main

    main(["--op", "decode", *sys.argv[1:]])
