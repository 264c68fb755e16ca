"""Random stacks of real shapes with dense or MSA attention, a cache filled as if prefilled, copy
bandwidth and step timing: what the engine GPU sections share."""
from __future__ import annotations

import gc
import statistics
import time

import torch

from engine.attention import make_attention as engine_attention
from engine.attention.msa import MSAAttention
from engine.testing import random_engine, random_indexer, random_model, shape_config


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free() -> None:
    """Drop what the last stack left (its weights must not count in the next one's peak)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def copy_bandwidth(gib: float = 2.0, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s counting bytes read and written (median of `reps`
    copies after 3 warm-up copies)."""
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


def make_attention(cfg, kind: str, device: str = "cuda"):
    """('dense' | 'msa' | 'msa-eager') -> (attention, index_dim, index_layers): what `--attention` would
    build on `device` (`engine.attention.make_attention`), MSA with random index projections on every
    layer (`engine.testing.random_indexer`); 'msa-eager' is the plain `MSAAttention` with the Triton
    kernels (per layer the indexer and the attention plan and sync on their own, no CUDA graphs)."""
    if kind == "dense":
        return engine_attention(kind, device, cfg), 0, ()
    if kind not in ("msa", "msa-eager"):
        raise ValueError(f"unknown attention kind {kind!r}: use dense, msa or msa-eager")
    indexer = random_indexer(cfg, device)
    if kind == "msa":
        attn = engine_attention("msa", device, cfg, indexer)
    else:
        attn = MSAAttention(indexer.config, indexer.projections, indexer.rope, cfg.num_layers, cfg.head_dim ** -0.5,
                            engine_attention("dense", device, cfg), impl="triton")
    return attn, indexer.config.d_idx, indexer.layers


def stack_engine(shape: str, kind: str, kv_tokens: int, layers: int | None = None, max_num_seqs: int = 16,
                 max_batched: int = 8192, max_model_len: int | None = None, cuda_graphs: bool = True, model=None,
                 device: str = "cuda", **shape_overrides):
    """(engine, model): a random `shape` stack (or `model`) behind `kind` attention."""
    over = dict(shape_overrides, **({"num_layers": layers} if layers else {}))
    if max_model_len:
        over["max_position"] = max_model_len
    cfg = shape_config(shape, **over)
    model = model if model is not None else random_model(cfg, device)
    attn, idx_dim, idx_layers = make_attention(cfg, kind, device)
    eng = random_engine(model, attn, device, kv_tokens, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched,
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
        fill_cache(eng.cache)


def fill_cache(cache) -> None:
    """Random contents for every page of `cache`: N(0, 1) values, or for an FP8 cache e4m3 codes of magnitude
    up to 240 (no NaN code) and int8 index keys, with scales that keep them near unit size."""
    for t in list(cache.k) + list(cache.v) + list(cache.k_idx.values()):
        if t.dtype == torch.float8_e4m3fn:
            t.view(torch.uint8).random_(0, 0x78)  # codes 0x00-0x77: +0 .. +240, sign bit clear
        elif t.dtype == torch.int8:
            t.random_(-127, 128)
        else:
            t.normal_(0.0, 1.0)
    for s in cache.k_scale + cache.v_scale:
        s.fill_(1 / 240)
    for s in cache.k_idx_scale.values():
        s.fill_(1 / 127)


def timed_steps(eng, steps: int, warmup: int = 2) -> list[float]:
    """Wall-clock seconds of `steps` engine steps after `warmup` (each step ends with a host copy of the tokens)."""
    for _ in range(warmup):
        eng.step()
    sync()
    out = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        out.append(time.perf_counter() - t)
    return out
