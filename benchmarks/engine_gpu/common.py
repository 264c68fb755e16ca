"""Shared helpers of the engine GPU benchmarks: environment, copy bandwidth, random stacks with
dense or MSA attention, a cache filled as if prefilled, and step timing."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time

import torch

from engine.attention.dense import DenseAttention
from engine.random_model import MSA_SHAPES, random_engine, random_model, shape_config


def env_info() -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    info = {"gpu": p.name, "sms": p.multi_processor_count, "gpu_mem_gib": round(p.total_memory / 2**30, 1),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "python": platform.python_version()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def copy_bandwidth(gib: float = 2.0, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s counting bytes read and written (median)."""
    n = int(gib * 2**30) // 2
    a = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(reps + 3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * n * 2 / statistics.median(times[3:])


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every parameter except the embedding table (one row)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n != "embed") + \
        (model.embed.numel() * model.embed.element_size() if model.lm_head is None else 0)


def kv_bytes_per_token(cfg, ctx: int, dtype_size: int = 2) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_size * ctx


def make_attention(cfg, kind: str, device: str = "cuda", dtype: torch.dtype = torch.bfloat16, topk: int | None = None,
                   dense_layers: tuple[int, ...] = ()):
    """('dense' | 'msa' | 'msa-eager') -> (attention, index_dim, index_layers). MSA: the engine's MSA
    layers with random index projections (every layer MSA unless `dense_layers`); 'msa' has the
    capturable decode (`GraphMSAAttention`, what `--attention msa` gets on a GPU), 'msa-eager' is the
    plain `MSAAttention` (per-layer indexer + attention calls that plan and sync on their own: the
    GPU decode path before `GraphMSAAttention` was wired in)."""
    if kind == "dense":
        return DenseAttention(cfg.head_dim ** -0.5), 0, ()
    if kind not in ("msa", "msa-eager"):
        raise ValueError(f"unknown attention kind {kind!r}: use dense, msa or msa-eager")
    from engine.attention.msa import MSAAttention
    from engine.gpu.msa_graph import GraphMSAAttention
    from engine.msa import IndexProjections, IndexRope, MSAConfig

    shape = MSA_SHAPES["m3-attn"]
    msa = MSAConfig(block_size=shape.block_size, topk=topk or shape.topk, d_idx=cfg.head_dim,
                    dense_layers=tuple(dense_layers))
    proj = IndexProjections(cfg, msa)
    with torch.no_grad():
        for p in proj.parameters():
            p.normal_(0.0, 0.02)
    proj.to(device=device, dtype=dtype)
    cls = GraphMSAAttention if kind == "msa" else MSAAttention
    attn = cls(msa, proj, IndexRope(cfg, msa.d_idx, torch.device(device)), cfg.num_layers, cfg.head_dim ** -0.5)
    return attn, msa.d_idx, proj.layer_ids


def stack_engine(shape: str, kind: str, kv_tokens: int, layers: int | None = None, max_num_seqs: int = 16,
                 max_batched: int = 8192, max_model_len: int | None = None, cuda_graphs: bool = True, model=None):
    over = {"num_layers": layers} if layers else {}
    if max_model_len:
        over["max_position"] = max_model_len
    cfg = shape_config(shape, **over)
    model = model if model is not None else random_model(cfg, "cuda")
    attn, idx_dim, idx_layers = make_attention(cfg, kind)
    eng = random_engine(model, attn, "cuda", kv_tokens, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched,
                        max_model_len=max_model_len, cuda_graphs=cuda_graphs, index_dim=idx_dim,
                        index_layers=idx_layers)
    return eng, model


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 1, (n,), generator=g).tolist()


def fake_prefill(eng, n_req: int, ctx: int, max_tokens: int) -> None:
    """Requests whose first ctx - 1 tokens count as already in the cache (filled with random K/V and
    index keys): every following step is a decode step at context ~ctx, without paying a prefill.
    Decode cost does not depend on the cached values (MSA reads k pages whichever they are)."""
    from engine.sampling import SamplingParams

    vocab = eng.model.cfg.vocab_size
    for i in range(n_req):
        eng.add_request(f"r{i}", random_prompt(ctx, vocab, i), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    eng.scheduler._admit()
    if len(eng.scheduler.running) != n_req:
        raise RuntimeError(f"cache holds {len(eng.scheduler.running)} of {n_req} requests")
    for seq in eng.scheduler.running:
        seq.num_computed = ctx - 1
    with torch.no_grad():
        for t in list(eng.cache.k) + list(eng.cache.v) + list(eng.cache.k_idx.values()):
            t.normal_(0.0, 1.0)


def timed_steps(eng, steps: int, warmup: int = 2) -> list[float]:
    """Wall-clock seconds of `steps` engine steps after `warmup` (each step ends with a host copy of the tokens)."""
    for _ in range(warmup):
        eng.step()
    torch.cuda.synchronize()
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        out.append(time.perf_counter() - t)
    return out


def save(path: str, rows: list[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, path)


def run_sections(sections: dict, skip: str, rows: list[dict], path: str) -> None:
    """Run each benchmark section (name -> callable appending to `rows`) unless named in the comma list
    `skip`; a failing section leaves an error row and the other sections' numbers; `rows` is saved to
    `path` after every section."""
    import traceback

    for name, fn in sections.items():
        if name in skip.split(","):
            continue
        try:
            fn()
        except Exception as e:  # keep the other sections' numbers
            traceback.print_exc()
            rows.append({"bench": "error", "section": name, "error": repr(e)})
        save(path, rows)
