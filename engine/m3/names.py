"""MiniMax-M3 text-model tensor names and shapes in the Hugging Face hub layout (the one
`MiniMaxM3SparseForConditionalGeneration.save_pretrained` writes, less its `language_model.` prefix):
per-expert `block_sparse_moe.experts.E.w1/w2/w3`, `self_attn.index_q_proj`, separate gate / up
projections. `checkpoint_tensors` is what a checkpoint must hold for `cfg`; `projection_weights`
the 2-D matrices a block-FP8 checkpoint may store in float8 (everything but embeddings, lm_head,
norms and the router)."""
from __future__ import annotations

from engine.config import ModelConfig
from engine.errors import UnsupportedModelError

LAYER = "model.layers.{i}."
MOE = "block_sparse_moe."


def _m3(cfg: ModelConfig):
    if cfg.m3 is None:
        raise UnsupportedModelError(f"architecture '{cfg.arch}' is not MiniMax-M3: its checkpoint has no M3 tensors")
    return cfg.m3


def layer_tensors(cfg: ModelConfig, i: int) -> dict[str, tuple[int, ...]]:
    """The tensors of decoder layer `i` with their shapes (names without the `language_model.` prefix)."""
    m3 = _m3(cfg)
    h, d, hq, hkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    p = LAYER.format(i=i)
    t: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (hq * d, h),
        p + "self_attn.k_proj.weight": (hkv * d, h),
        p + "self_attn.v_proj.weight": (hkv * d, h),
        p + "self_attn.o_proj.weight": (h, hq * d),
        p + "self_attn.q_norm.weight": (d,),
        p + "self_attn.k_norm.weight": (d,),
    }
    if m3.layer_types[i] == "minimax_m3_sparse":
        di = m3.index_head_dim
        t |= {p + "self_attn.index_q_proj.weight": (m3.index_heads * di, h),
              p + "self_attn.index_k_proj.weight": (di, h),
              p + "self_attn.index_q_norm.weight": (di,),
              p + "self_attn.index_k_norm.weight": (di,)}
    if m3.mlp_layer_types[i] == "dense":
        t |= _swiglu(p + "mlp.", m3.dense_intermediate_size, h)
    else:
        q, n = p + MOE, m3.moe_intermediate_size
        t |= {q + "gate.weight": (m3.num_experts, h), q + "e_score_correction_bias": (m3.num_experts,)}
        for e in range(m3.num_experts):
            t |= {f"{q}experts.{e}.w1.weight": (n, h), f"{q}experts.{e}.w2.weight": (h, n),
                  f"{q}experts.{e}.w3.weight": (n, h)}
        t |= _swiglu(q + "shared_experts.", m3.shared_intermediate_size, h)
    return t


def _swiglu(prefix: str, inter: int, hidden: int) -> dict[str, tuple[int, ...]]:
    return {prefix + "gate_proj.weight": (inter, hidden), prefix + "up_proj.weight": (inter, hidden),
            prefix + "down_proj.weight": (hidden, inter)}


def checkpoint_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every text-model tensor of the hub layout with its shape, in model order; `lm_head.weight`
    is absent when the embeddings are tied."""
    t: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    for i in range(cfg.num_layers):
        t |= layer_tensors(cfg, i)
    t["model.norm.weight"] = (cfg.hidden_size,)
    if not cfg.tie_embeddings:
        t["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return t


def is_projection(name: str) -> bool:
    """A 2-D projection of the text model (attention q/k/v/o, index q/k, dense / shared / routed expert
    matrices): the tensors block-FP8 checkpoints store in float8 with a `weight_scale_inv` beside them."""
    if not (name.startswith("model.layers.") and name.endswith(".weight")):
        return False
    leaf = name.rsplit(".", 2)[-2]
    return leaf in ("q_proj", "k_proj", "v_proj", "o_proj", "index_q_proj", "index_k_proj",
                    "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
