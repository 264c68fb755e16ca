"""Test and benchmark helpers: random-weight decoder stacks of real shapes (`random_model`), random
MSA indexers for them (`random_indexer`, then `engine.attention.make_attention`) and an engine over
them (`random_engine`), for speed and memory measurements and engine tests only; `all_logits` runs a
loaded `LLM` over a prompt outside the scheduler (the logits of every position).

Timing depends on shapes, not on trained values, so these stand in for checkpoints that cannot be
downloaded here. `llama-3.1-8b`: 32 layers, hidden 4096, 32 query / 8 KV heads of d 128, FFN
14336, vocab 128256, llama3 RoPE. `m3-attn`: the MiniMax-M3 attention shape (64 query / 4 KV heads
of d 128; MSA with 4 index heads x 128, block 128, top-k 16) with a dense FFN standing in for the
MoE's active experts and few layers. Outputs are meaningless text; never use them for quality.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.config import ModelConfig, RopeScaling
from engine.model import CausalLM

SHAPES: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig(
        arch="llama", vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=14336, max_position=131072, rms_eps=1e-5, rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)),
    "m3-attn": ModelConfig(
        arch="llama", vocab_size=200064, hidden_size=3072, num_layers=4, num_heads=64, num_kv_heads=4,
        head_dim=128, intermediate_size=8192, max_position=1 << 20, rms_eps=1e-6, rope_theta=5000000.0),
}


@dataclass(frozen=True)
class MSAShape:
    """The MSA side of a shape: one index-query head per KV group, one shared index-key head."""

    index_dim: int = 128
    block_size: int = 128
    topk: int = 16


MSA_SHAPES = {"m3-attn": MSAShape(), "llama-3.1-8b": MSAShape()}


def shape_config(name: str, **overrides) -> ModelConfig:
    """A named shape, with fields replaced (e.g. num_layers=2, max_position=...)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: use one of {', '.join(SHAPES)}")
    return replace(SHAPES[name], **overrides)


@torch.no_grad()
def random_model(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0):
    """A `CausalLM` of `cfg` (an `engine.m3.model.M3CausalLM` for a MiniMax-M3 config) with N(0, 0.02)
    matrices, unit norms and zero biases, allocated directly on `device` in `dtype` the way the checkpoint
    loaders allocate it (no float32 copy on the host: an 8B stack is 16 GB in bf16, the 4-layer M3 slice 47)."""
    device = torch.device(device)
    with torch.device("meta"):
        if cfg.family == "minimax_m3":
            from engine.m3.model import M3CausalLM

            model = M3CausalLM(cfg)
        else:
            model = CausalLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.normal_(0.0, 0.02, generator=gen)
    model.setup_rope(device)
    return model.eval()


def random_indexer(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
                   topk: int | None = None, dense_layers: tuple[int, ...] = (), shape: str = "m3-attn"):
    """An `engine.attention.Indexer` for `cfg` with N(0, 0.02) index projections (drawn from torch's
    global generator: seed it for repeatable picks); every layer MSA unless in `dense_layers`; block,
    top-k from `MSA_SHAPES[shape]`, index head dim = the model's head dim."""
    from engine.attention import Indexer
    from engine.msa import IndexProjections, IndexRope, MSAConfig

    s = MSA_SHAPES[shape]
    msa = MSAConfig(block_size=s.block_size, topk=topk or s.topk, d_idx=cfg.head_dim, dense_layers=tuple(dense_layers))
    proj = IndexProjections(cfg, msa)
    with torch.no_grad():
        for p in proj.parameters():
            p.normal_(0.0, 0.02)
    proj.to(device=device, dtype=dtype)
    return Indexer(msa, proj, IndexRope(cfg, msa.d_idx, torch.device(device)))


class _NoTokenizer:
    """Random stacks have no vocabulary: no EOS, no text (use ignore_eos and no stop strings)."""

    eos_token_ids: set[int] = set()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        raise ValueError("a random-weight stack has no tokenizer: use token ids and no stop strings")


def random_engine(model: CausalLM, attention, device: torch.device | str, kv_cache_tokens: int,
                  max_num_seqs: int = 16, max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
                  cuda_graphs: bool = True, index_dim: int = 0, index_layers: tuple[int, ...] = (),
                  page_size: int = 128, telemetry=None, kv_dtype: torch.dtype | None = None):
    """An `LLMEngine` over a random stack (drive it with token ids: `stream`, or add_request / step; read
    results with `pop_finished`: a random stack has no text). MSA: pass the indexer's `config.d_idx`
    and `layers` as `index_dim` / `index_layers`; `telemetry` an `engine.msa.telemetry.TelemetryConfig`;
    `kv_dtype` the K/V cache's (None: the model's; torch.float8_e4m3fn: `--kv-cache-dtype fp8`'s cache)."""
    from engine.kv_cache import CacheConfig, KVCache
    from engine.llm_engine import LLMEngine
    from engine.scheduler import SchedulerConfig

    cfg, device = model.cfg, torch.device(device)
    dtype = next(model.parameters()).dtype
    kv = kv_dtype or dtype
    cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                    CacheConfig(page_size=page_size, num_pages=-(-kv_cache_tokens // page_size), dtype=kv,
                                model_dtype=dtype if kv != dtype else None),
                    device, index_dim=index_dim, index_layers=index_layers)
    return LLMEngine(model, _NoTokenizer(), attention, cache, SchedulerConfig(max_num_seqs, max_num_batched_tokens),
                     max_model_len or cfg.max_position, device, cuda_graphs=cuda_graphs, telemetry=telemetry)


def all_logits(llm, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Logits fp32 `[len(ids), vocab]` of every position of `ids` on a loaded `engine.LLM`, prefilled in chunks
    of `chunk` tokens (None = one shot); the request's cache pages are released afterwards."""
    from engine.sampling import SamplingParams
    from engine.scheduler import ScheduledChunk
    from engine.sequence import Sequence

    eng = llm.engine
    seq = Sequence("probe", list(ids), SamplingParams(), max_len=len(ids))
    eng.blocks.grow("probe", len(ids))
    outs = []
    try:
        step = chunk or len(ids)
        for s in range(0, len(ids), step):
            c = ScheduledChunk(seq, s, min(step, len(ids) - s))
            i, p, m = eng._pack([c])
            with torch.inference_mode():
                outs.append(llm.model.logits(llm.model.hidden_states(i, p, m, llm.cache, eng.attention)))
            seq.num_computed += c.length
    finally:
        eng.blocks.release("probe")
    return torch.cat(outs)


def decode_step_meta(lens: list[int], num_pages: int, page_size: int, generator: torch.Generator,
                     q_lens: list[int] | None = None, **kw):
    """An `AttentionMeta` of a decode step (one query per request; `q_lens`: that many each, a mixed step of
    prompt chunks and decode tokens) over `lens` keys per request, each request's pages a random scattered
    subset of `num_pages` (page table padded with -1); `kw` adds fields (telemetry)."""
    from engine.attention.meta import AttentionMeta

    perm = torch.randperm(num_pages, generator=generator).tolist()
    lists, at = [], 0
    for n in lens:
        lists.append(perm[at:at + -(-n // page_size)])
        at += len(lists[-1])
    table = torch.full((len(lens), max(map(len, lists))), -1, dtype=torch.int32)
    for r, pl in enumerate(lists):
        table[r, :len(pl)] = torch.tensor(pl, dtype=torch.int32)
    z = torch.zeros(1, dtype=torch.int32)
    return AttentionMeta(cu_seqlens_q=z, seq_lens_kv=z, page_table=table, slot_pages=z, slot_offsets=z,
                         q_lens=q_lens or [1] * len(lens), kv_lens=list(lens), page_lists=lists,
                         is_decode=not q_lens or all(n == 1 for n in q_lens), **kw)
