"""One rank's shard of a model, for both families, and `ParallelModel`, what the engine drives.

A shard is the family's own model class built from the rank's config (`sharding.local_config`) and
filled with the rank's slices of the checkpoint (`sharding.shard_tensor`); each decoder layer's `reduce`
hook becomes the group's all-reduce, so o_proj and the MLP / MoE outputs are summed over the ranks
before the residual add. M3's MoE layers hold only the rank's routed experts (`ExpertShard`).

`ParallelModel` has the model interface the engine uses (`cfg`, `hidden_states`, `logits`, and the
shard's other attributes). On rank 0, `hidden_states` first sends the step's inputs to the other ranks
(`TensorParallel.send_step`), which run the same forward on their shards in lockstep. A forward that
fails on any rank stops the group (the ranks could be out of step): that step's requests fail as with
one process, later forwards raise a line saying to load the LLM again.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.config import ModelConfig
from engine.m3.moe import MoE
from engine.parallel.sharding import expert_range, holds, local_config, shard_tensor, shard_weights


class ParallelModel(nn.Module):
    def __init__(self, shard: nn.Module, group: Any):
        super().__init__()
        self.shard = shard
        self.group = group  # engine.parallel.launch.TensorParallel
        for layer in shard.layers:
            layer.reduce = group.all_reduce

    @property
    def cfg(self) -> ModelConfig:
        """The shard's config (its local head counts: what the cache and the decode plans are sized by)."""
        return self.shard.cfg

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta, cache, attn) -> torch.Tensor:
        if self.group.rank != 0:
            return self.shard.hidden_states(input_ids, positions, meta, cache, attn)
        self.group.send_step(input_ids, positions, meta)
        try:
            return self.shard.hidden_states(input_ids, positions, meta, cache, attn)
        except BaseException as e:
            self.group.fail(e)  # the ranks may be out of step (some collectives done, some not): stop them
            raise

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.shard.logits(h)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "shard":
                raise
            return getattr(self.shard, name)


def llama_shard(cfg: ModelConfig, weights: dict[str, torch.Tensor], rank: int, world: int) -> nn.Module:
    """A Llama-family `CausalLM` of the rank's heads and MLP rows, its slices of `weights` loaded."""
    from engine.model import CausalLM

    model = CausalLM(local_config(cfg, world))
    model.load_weights(shard_weights(cfg, weights, rank, world))
    return model


class ExpertShard(MoE):
    """An M3 MoE block holding the routed experts `experts` only (expert parallel): it routes every token
    over all experts (router and bias whole), runs its own experts on the tokens routed to them, adds its
    part of the shared expert, and leaves the sum over ranks to the layer's all-reduce. Build it under
    `torch.device("meta")` (the parent class lays out every expert before they are cut)."""

    def __init__(self, cfg: ModelConfig, experts: range):
        super().__init__(cfg)
        self.first_expert = experts.start
        self.w13 = nn.Parameter(self.w13[:len(experts)], requires_grad=False)
        self.w2 = nn.Parameter(self.w2[:len(experts)], requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`MoE.forward` over this rank's experts: every token routed, the other ranks' (token, expert)
        pairs add nothing (`kernels.moe`'s `first_expert`: no row, no compute)."""
        return self.routed(x, first_expert=self.first_expert) + self.shared(x)


def m3_shard(path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype, rank: int, world: int) -> nn.Module:
    """A MiniMax-M3 model of the rank's heads, MLP rows and experts, built on the device from its checkpoint
    (as `engine.m3.load.build_m3`, one tensor at a time; the other ranks' experts are not read)."""
    from engine.m3.checkpoint import open_checkpoint
    from engine.m3.model import M3CausalLM

    local = local_config(cfg, world)
    with open_checkpoint(path, cfg) as ckpt:  # the whole checkpoint checked against the whole config
        with torch.device("meta"):
            model = M3CausalLM(local)
            for layer in model.layers:
                if layer.moe:
                    layer.mlp = ExpertShard(local, expert_range(cfg, rank, world))
        model = model.to_empty(device=device).to(dtype)
        names = [n for n in ckpt.names() if holds(cfg, n, rank, world)]  # other ranks' experts: never read
        parts = (shard_tensor(cfg, n, ckpt.tensor(n), rank, world) for n in names)
        model.load_checkpoint(p for p in parts if p is not None)
    model.prepare(device)
    return model.eval()
