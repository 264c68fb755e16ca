"""What `msa-eval models info` shows for a MiniMax-M3 directory, from its config.json and the safetensors
headers only (no tensor data read: the real checkpoint is hundreds of GB)."""
from __future__ import annotations

import dataclasses
from itertools import groupby
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.kv_cache import bytes_per_token, index_key_dtype
from engine.m3.checkpoint import open_checkpoint

SHORT = {"full_attention": "full", "minimax_m3_sparse": "sparse", "dense": "dense", "sparse": "moe"}


def counts(types: tuple[str, ...]) -> str:
    """"full x1, sparse x3": each kind with how many layers have it, in first-seen order."""
    seen = dict.fromkeys(types)
    return ", ".join(f"{SHORT[t]} x{types.count(t)}" for t in seen)


def runs(types: tuple[str, ...]) -> str:
    """"0-2 full, 3-59 sparse": the layers as runs of one kind."""
    out, i = [], 0
    for t, g in groupby(types):
        n = len(list(g))
        out.append(f"{i}-{i + n - 1} {SHORT[t]}" if n > 1 else f"{i} {SHORT[t]}")
        i += n
    return ", ".join(out)


def describe(path: Path, cfg: ModelConfig) -> dict[str, Any]:
    """The M3 fields of `models info` (the checkpoint is checked as `open_checkpoint` does)."""
    m3 = cfg.m3
    assert m3 is not None, "describe takes a MiniMax-M3 config"
    with open_checkpoint(path, cfg) as ck:
        params, dtypes, quant = ck.parameter_count(), ck.stored_dtypes(), ck.quantization_config
    return {
        "family": cfg.family,
        "layers": cfg.num_layers,
        "attention": counts(m3.layer_types),
        "mlp": counts(m3.mlp_layer_types),
        "layer_types": list(m3.layer_types),
        "mlp_layer_types": list(m3.mlp_layer_types),
        "experts": {"num_experts": m3.num_experts, "top_k": m3.experts_per_token,
                    "moe_intermediate_size": m3.moe_intermediate_size,
                    "shared_intermediate_size": m3.shared_intermediate_size,
                    "dense_intermediate_size": m3.dense_intermediate_size,
                    "routed_scaling_factor": m3.routed_scaling_factor},
        "msa": {"index_heads": m3.index_heads, "index_head_dim": m3.index_head_dim,
                "block_size": m3.index_block_size, "topk_blocks": m3.index_topk,
                "local_blocks": m3.index_local_blocks, "sparse_layers": len(m3.sparse_layers)},
        "quantization": quant,
        "stored_dtypes": dtypes,
        "parameters": params,
        "kv_cache_bytes_per_token_bf16": bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                         torch.bfloat16, index_dim=m3.index_head_dim,
                                                         num_index_layers=len(m3.sparse_layers)),
        # --kv-cache-dtype fp8: e4m3 K/V + a fp32 scale per token and KV head, int8 index keys + a fp32 scale
        "kv_cache_bytes_per_token_fp8": bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                        torch.float8_e4m3fn, index_dim=m3.index_head_dim,
                                                        num_index_layers=len(m3.sparse_layers),
                                                        index_dtype=index_key_dtype(torch.float8_e4m3fn,
                                                                                    torch.bfloat16)),
        "config": dataclasses.asdict(cfg),
    }


def _quantization(d: dict[str, Any]) -> str:
    q = d["quantization"]
    stored = ", ".join(f"{k} x{n}" for k, n in sorted(d["stored_dtypes"].items()))
    if not q:
        return f"none ({stored})"
    block = "x".join(str(b) for b in q["weight_block_size"])
    return f"{q['quant_method']} {q.get('fmt', 'e4m3')}, {block} blocks ({stored})"


def rows(d: dict[str, Any]) -> list[tuple[str, Any]]:
    """The table rows of `describe`'s fields."""
    c, e, s = d["config"], d["experts"], d["msa"]
    n = d["parameters"]
    experts = (f"{e['num_experts']} routed, top-{e['top_k']}, intermediate moe {e['moe_intermediate_size']} / "
               f"shared {e['shared_intermediate_size']} / dense {e['dense_intermediate_size']}")
    msa = (f"index {s['index_heads']} heads x {s['index_head_dim']}, block {s['block_size']}, "
           f"top-{s['topk_blocks']} blocks, {s['local_blocks']} local")
    heads = f"{c['num_heads']}/{c['num_kv_heads']} (head dim {c['head_dim']}, rotary {c['m3']['rotary_dim']})"
    return [
        ("family", d["family"]),
        ("layers", f"{d['layers']}: attention {d['attention']}; mlp {d['mlp']}"),
        ("attention layers", runs(tuple(d["layer_types"]))),
        ("mlp layers", runs(tuple(d["mlp_layer_types"]))),
        ("hidden", c["hidden_size"]),
        ("heads q/kv", heads),
        ("experts", experts),
        ("msa", msa),
        ("quantization", _quantization(d)),
        ("context", c["max_position"]),
        ("vocab", c["vocab_size"]),
        ("parameters", f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.3f} M"),
        ("kv cache / token", (f"{d['kv_cache_bytes_per_token_bf16']} bytes (bf16), "
                              f"{d['kv_cache_bytes_per_token_fp8']} bytes (--kv-cache-dtype fp8)")),
    ]
