"""How a model splits over N tensor-parallel ranks: the one place that decides it, for both families.

- Attention: the KV heads split into N contiguous groups; rank r keeps its KV heads and the query heads
  that read them (a GQA group's query heads are contiguous), i.e. rows of q/k/v_proj (and their biases),
  and the matching input columns of o_proj. MSA: one index-query head per KV group, so the index query's
  rows split with the KV heads (the selection per KV group is rank-local); the shared index key and
  every norm are replicated.
- MLPs (Llama's; M3's dense MLPs and its shared expert): the intermediate dim splits (gate/up rows,
  down columns).
- M3's MoE, expert parallel: rank r keeps the routed experts `[r E/N, (r+1) E/N)` whole; the router
  and its correction bias are replicated (every rank routes every token).
- Embedding, final norm and lm_head: replicated.

Every split is a contiguous chunk along one dim, so a rank's tensor is `t.chunk(N, dim)[r]`. The layers
sum the partial outputs (o_proj, down, the MoE block) with an all-reduce (`engine.parallel.model`).
`shard_tensor` takes the checkpoint's own names (HF Llama names, M3 hub names), one tensor at a time, so
a streamed loader keeps only its rank's slices.
"""
from __future__ import annotations

import re
from dataclasses import replace

import torch

from engine.config import ModelConfig
from engine.errors import EngineError

# (name pattern, dim the tensor is chunked along); names matching none are replicated
_SPLITS: tuple[tuple[re.Pattern[str], int], ...] = tuple((re.compile(p), d) for p, d in (
    (r"\.self_attn\.[qkv]_proj\.(weight|bias)$", 0),  # heads: rows
    (r"\.self_attn\.index_q_proj\.weight$", 0),  # one index head per KV group: rows
    (r"\.self_attn\.o_proj\.weight$", 1),  # input columns of the local query heads
    (r"\.(mlp|shared_experts)\.(gate|up)_proj\.weight$", 0),  # intermediate rows
    (r"\.(mlp|shared_experts)\.down_proj\.weight$", 1),  # intermediate columns
))
_EXPERT = re.compile(r"\.experts\.(\d+)\.")  # an M3 routed expert's tensor: kept whole by its rank


class ShardingError(EngineError):
    """A tensor-parallel size the model cannot split into."""


def _divisors(sizes: list[int]) -> list[int]:
    return [n for n in range(1, min(sizes) + 1) if all(s % n == 0 for s in sizes)]


def split_sizes(cfg: ModelConfig) -> dict[str, int]:
    """What must divide by the tensor-parallel size: name -> size."""
    sizes = {"KV heads": cfg.num_kv_heads}
    if cfg.m3 is None:
        sizes["MLP intermediate size"] = cfg.intermediate_size
        return sizes
    m3 = cfg.m3
    if m3.moe_layers:
        sizes |= {"routed experts": m3.num_experts, "shared expert intermediate size": m3.shared_intermediate_size}
    if len(m3.moe_layers) < cfg.num_layers:
        sizes["dense MLP intermediate size"] = m3.dense_intermediate_size
    return sizes


def check_size(cfg: ModelConfig, world: int) -> None:
    """One line naming the fix when `world` ranks cannot split the model."""
    sizes = split_sizes(cfg)
    for what, n in sizes.items():
        if n % world:
            ok = ", ".join(map(str, _divisors(list(sizes.values()))))
            raise ShardingError(f"tensor_parallel_size {world} does not divide the model's {n} {what}: "
                                f"use one of {ok}")


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The config of one rank's shard: its heads and intermediate sizes (M3: the router still sees every
    expert, so `num_experts` stays; `expert_range` says which ones the rank holds)."""
    check_size(cfg, world)
    local = replace(cfg, num_heads=cfg.num_heads // world, num_kv_heads=cfg.num_kv_heads // world,
                    intermediate_size=cfg.intermediate_size // world)
    if cfg.m3 is None:
        return local
    m3 = cfg.m3
    return replace(local, m3=replace(m3, index_heads=m3.index_heads // world,
                                     dense_intermediate_size=m3.dense_intermediate_size // world,
                                     shared_intermediate_size=m3.shared_intermediate_size // world))


def expert_range(cfg: ModelConfig, rank: int, world: int) -> range:
    """The routed experts rank `rank` holds (M3)."""
    assert cfg.m3 is not None
    n = cfg.m3.num_experts // world
    return range(rank * n, (rank + 1) * n)


def holds(cfg: ModelConfig, name: str, rank: int, world: int) -> bool:
    """Whether rank `rank` keeps any of checkpoint tensor `name` (not: another rank's expert), so a loader
    can skip reading the rest."""
    m = _EXPERT.search(name)
    return m is None or cfg.m3 is None or int(m.group(1)) in expert_range(cfg, rank, world)


def shard_tensor(cfg: ModelConfig, name: str, t: torch.Tensor, rank: int, world: int
                 ) -> tuple[str, torch.Tensor] | None:
    """Rank `rank`'s part of checkpoint tensor `name` under its (local) name, or None when the rank holds
    none of it (`holds`)."""
    if not holds(cfg, name, rank, world):
        return None
    m = _EXPERT.search(name)
    if m is not None and cfg.m3 is not None:
        first = expert_range(cfg, rank, world).start
        return name[:m.start(1)] + str(int(m.group(1)) - first) + name[m.end(1):], t
    for pattern, dim in _SPLITS:
        if pattern.search(name):
            return name, t.chunk(world, dim)[rank].contiguous()
    return name, t


def shard_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], rank: int, world: int
                  ) -> dict[str, torch.Tensor]:
    """`shard_tensor` over a loaded checkpoint (name -> tensor)."""
    out = (shard_tensor(cfg, n, t, rank, world) for n, t in weights.items())
    return dict(x for x in out if x is not None)


def shard_indexer(indexer, cfg: ModelConfig, rank: int, world: int):
    """An adapter's `engine.attention.Indexer` cut to the rank's KV groups (index-query rows; the shared
    index key and the norms whole), on the indexer's device and dtype."""
    from engine.attention.factory import Indexer
    from engine.msa.projections import IndexProjections

    proj = indexer.projections
    p = next(proj.parameters())
    eps = next(iter(proj.layers.values())).eps
    local = IndexProjections(local_config(cfg, world), proj.msa, eps)
    for i in local.layer_ids:
        if str(i) not in proj.layers:
            del local.layers[str(i)]
    state = {k: (v.chunk(world, 0)[rank] if k.endswith(".wq") else v) for k, v in proj.layers.state_dict().items()}
    local.layers.load_state_dict(state)
    local.to(device=p.device, dtype=p.dtype)
    return Indexer(indexer.config, local, indexer.rope)
