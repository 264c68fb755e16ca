"""Typed MiniMax-M3 settings (the fields of its `text_config` a Llama-family config lacks), read from a
transformers `config.json` of `MiniMaxM3SparseForConditionalGeneration` (`model_type` "minimax_m3_vl",
the settings under `text_config`) or of its text model ("minimax_m3_vl_text").

The reading follows transformers' `MiniMaxM3VLTextConfig`: `layer_types` ("full_attention" |
"minimax_m3_sparse") and `mlp_layer_types` ("dense" | "sparse"), else the legacy
`sparse_attention_config` (`sparse_attention_freq`, `sparse_num_index_heads`, `sparse_index_dim`,
`sparse_block_size`, `sparse_topk_blocks`, `sparse_local_block`) and `moe_layer_freq`. RoPE rotates
`head_dim * partial_rotary_factor` channels (from `rope_parameters`, else the top level, else 1.0), as
transformers' modeling does; `rotary_dim` is only the fallback when no factor is written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import UnsupportedModelError

M3_MODEL_TYPES = ("minimax_m3_vl", "minimax_m3_vl_text")
ATTENTION_TYPES = ("full_attention", "minimax_m3_sparse")
MLP_TYPES = ("dense", "sparse")


@dataclass(frozen=True)
class M3Settings:
    layer_types: tuple[str, ...]  # per layer: "full_attention" | "minimax_m3_sparse"
    mlp_layer_types: tuple[str, ...]  # per layer: "dense" | "sparse" (MoE)
    rotary_dim: int  # channels of each head that RoPE rotates (the first ones); the rest pass through
    dense_intermediate_size: int
    moe_intermediate_size: int  # per routed expert
    shared_intermediate_size: int
    num_experts: int
    experts_per_token: int
    routed_scaling_factor: float
    swiglu_alpha: float
    swiglu_limit: float
    index_heads: int  # one per KV group
    index_head_dim: int
    index_block_size: int
    index_topk: int  # blocks per query and KV group, the own block included
    index_local_blocks: int

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "minimax_m3_sparse")

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.mlp_layer_types) if t == "sparse")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text model's settings: `text_config` of the VL wrapper, or the dict itself."""
    return cfg.get("text_config") or cfg if cfg.get("model_type") == "minimax_m3_vl" else cfg


def _per_layer(name: str, values: Any, allowed: tuple[str, ...], n: int) -> tuple[str, ...]:
    values = tuple(values)
    if len(values) != n or any(v not in allowed for v in values):
        raise UnsupportedModelError(f"config {name} must list one of {allowed} for each of the {n} layers, got "
                                    f"{list(values)[:8]}{'...' if len(values) > 8 else ''}: fix config.json")
    return values


def read_m3_settings(tc: dict[str, Any], num_layers: int, head_dim: int) -> M3Settings:
    """`tc`: the text config dict (`text_config`)."""
    sparse = tc.get("sparse_attention_config") or {}
    layer_types = tc.get("layer_types")
    if layer_types is None and "sparse_attention_freq" in sparse:
        layer_types = ["minimax_m3_sparse" if f else "full_attention" for f in sparse["sparse_attention_freq"]]
    mlp_types = tc.get("mlp_layer_types")
    if mlp_types is None and tc.get("moe_layer_freq") is not None:
        mlp_types = ["sparse" if f else "dense" for f in tc["moe_layer_freq"]]

    def idx(flat: str, legacy: str, default: int) -> int:
        return int(sparse.get(legacy, tc.get(flat, default)))

    rope = tc.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", tc.get("partial_rotary_factor"))
    rotary_dim = int(head_dim * float(factor)) if factor is not None else int(tc.get("rotary_dim") or head_dim)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise UnsupportedModelError(f"RoPE over {rotary_dim} of {head_dim} head channels cannot work: fix "
                                    "partial_rotary_factor in config.json")
    return M3Settings(
        layer_types=_per_layer("layer_types", layer_types or ["full_attention"] * num_layers, ATTENTION_TYPES,
                               num_layers),
        mlp_layer_types=_per_layer("mlp_layer_types", mlp_types or ["sparse"] * num_layers, MLP_TYPES, num_layers),
        rotary_dim=rotary_dim,
        dense_intermediate_size=int(tc.get("dense_intermediate_size", 12288)),
        moe_intermediate_size=int(tc.get("intermediate_size", 3072)),
        shared_intermediate_size=int(tc.get("shared_intermediate_size", 3072)),
        num_experts=int(tc.get("num_local_experts", tc.get("num_experts", 128))),
        experts_per_token=int(tc.get("num_experts_per_tok", 4)),
        routed_scaling_factor=float(tc.get("routed_scaling_factor", 2.0)),
        swiglu_alpha=float(tc.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(tc.get("swiglu_limit", 7.0)),
        index_heads=idx("index_n_heads", "sparse_num_index_heads", 4),
        index_head_dim=idx("index_head_dim", "sparse_index_dim", 128),
        index_block_size=idx("index_block_size", "sparse_block_size", 128),
        index_topk=idx("index_topk_blocks", "sparse_topk_blocks", 16),
        index_local_blocks=idx("index_local_blocks", "sparse_local_block", 1),
    )
