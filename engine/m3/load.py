"""Build a MiniMax-M3 model from its checkpoint directory straight onto the device: the parameters are
allocated there (no host copy of the model), then filled from `engine.m3.checkpoint` one tensor at a time,
so host memory holds one tensor, not the checkpoint."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.m3.model import M3CausalLM


def build_m3(path: Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> M3CausalLM:
    from engine.m3.checkpoint import open_checkpoint

    with open_checkpoint(path, cfg) as ckpt:  # validates shards, names, shapes, quantization first
        with torch.device("meta"):
            model = M3CausalLM(cfg)
        model = model.to_empty(device=device).to(dtype)
        model.load_checkpoint(ckpt.items())
    model.prepare(device)
    return model.eval()
