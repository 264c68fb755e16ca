"""MiniMax-M3's decoder in the engine (the math of transformers' `minimax_m3_vl` modeling, our code).

Per layer: Gemma-style RMSNorms (`x_hat * (1 + w)`, the `1 + w` folded into the stored weight at load),
GQA attention with per-head RMSNorm on q and k and RoPE on the first `rotary_dim` channels of each head
(rotate-half within them; the rest pass through), the attention through the engine's one dispatch object
(dense, or MSA on the `minimax_m3_sparse` layers, whose index projections live in `indexer()`), then a
dense SwiGLU-OAI MLP or the MoE block (`engine.m3.moe`). Tokens are packed `[T]`, K/V go to the paged
cache, and the interface is `engine.model.CausalLM`'s (`hidden_states`, `logits`, `setup_rope`), so the
scheduler, sampler, server and runner drive it unchanged.

Weights load from `engine.m3.checkpoint` (hub tensor names), one tensor at a time (`load_checkpoint`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.meta import AttentionMeta
from engine.config import ModelConfig
from engine.errors import UnsupportedModelError
from engine.kv_cache import KVCache, rotate_qk, write_kv
from engine.m3.moe import DenseMLP, MoE, experts_impl
from engine.model import add_rms_norm, rms_norm, whole
from engine.msa.config import HEAD_DIMS
from engine.rope import RotaryEmbedding, apply_rope


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[T, H, d]`, cos/sin `[T, r]` (r <= d): rotate the first r channels, pass the rest."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)


class PartialIndexRope:
    """The index branch's RoPE (the `rope` argument of `engine.msa.projections.LayerIndexer`): the main
    attention's partial rotation, on the first `rotary_dim` channels of each index head."""

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return partial_rope(x, cos, sin)


def check_supported(cfg: ModelConfig) -> None:
    """One-line errors for M3 settings the engine's kernels cannot run."""
    m3 = cfg.m3
    assert m3 is not None
    if m3.sparse_layers and m3.index_heads != cfg.num_kv_heads:
        raise UnsupportedModelError(f"index_n_heads={m3.index_heads} must equal the {cfg.num_kv_heads} KV heads "
                                    "(one index head per KV group, as MiniMax-M3 has): fix config.json")
    if m3.sparse_layers and cfg.head_dim not in HEAD_DIMS:
        raise UnsupportedModelError(f"the MSA kernels run head dims {HEAD_DIMS}; this checkpoint has {cfg.head_dim}")
    if m3.sparse_layers and m3.index_local_blocks != 1:
        raise UnsupportedModelError(f"index_local_blocks={m3.index_local_blocks}: the MSA kernels force exactly the "
                                    "query's own block (index_local_blocks 1, as MiniMax-M3 ships)")


class M3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, idx: int):
        super().__init__()
        m3 = cfg.m3
        assert m3 is not None
        self.idx, self.cfg = idx, cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.in_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.post_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.qkv = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size, h), requires_grad=False)
        self.q_norm = nn.Parameter(torch.ones(d), requires_grad=False)
        self.k_norm = nn.Parameter(torch.ones(d), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(h, self.q_size), requires_grad=False)
        self.moe = m3.mlp_layer_types[idx] == "sparse"
        self.mlp = MoE(cfg) if self.moe else DenseMLP(h, m3.dense_intermediate_size, m3.swiglu_alpha, m3.swiglu_limit)
        self.reduce = whole  # o_proj and MLP outputs -> their sum over tensor-parallel ranks (engine.parallel)

    def forward(self, x, delta, cos, sin, meta: AttentionMeta, cache: KVCache, attn, positions):
        """As `engine.model.DecoderLayer.forward`: returns (x, this layer's MLP output)."""
        cfg, d, eps = self.cfg, self.cfg.head_dim, self.cfg.rms_eps
        if delta is None:
            h = add_rms_norm(x, self.in_norm, eps)
        else:
            h, x = add_rms_norm(delta, self.in_norm, eps, residual=x)
        q, k, v = F.linear(h, self.qkv).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = partial_rope(rms_norm(q.reshape(-1, cfg.num_heads, d), self.q_norm, eps), cos, sin)
        k = partial_rope(rms_norm(k.reshape(-1, cfg.num_kv_heads, d), self.k_norm, eps), cos, sin)
        kc, vc = cache.k[self.idx], cache.v[self.idx]
        ks, vs = cache.scales(self.idx)  # an FP8 cache: codes and per-row scales (engine.kv_cache.write_kv)
        if (rot := cache.k_rotation) is not None:  # fp8-hadamard (engine.kv_cache.CacheConfig.rotate_k)
            q, k = rotate_qk(q, k, rot)
        write_kv(kc, vc, ks, vs, meta.slot_pages, meta.slot_offsets, k, v.reshape(-1, cfg.num_kv_heads, d))
        o = attn(self.idx, q, kc, vc, meta, hidden=h, cos=cos, sin=sin, cache=cache, positions=positions,
                 k_scale=ks, v_scale=vs)
        o = self.reduce(F.linear(o.reshape(o.shape[0], -1), self.o_proj))
        h, x = add_rms_norm(o, self.post_norm, eps, residual=x)
        return x, self.reduce(self.mlp(h))


class M3CausalLM(nn.Module):
    """The text model of MiniMax-M3 (`MiniMaxM3SparseForConditionalGeneration`'s language model + lm_head)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.m3 is None:
            raise ValueError("M3CausalLM needs a MiniMax-M3 config (ModelConfig.m3)")
        check_supported(cfg)
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(M3DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size), requires_grad=False)
        self.lm_head = None if cfg.tie_embeddings else nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.index = _index_projections(cfg)
        self.rope: RotaryEmbedding | None = None
        self.fast_lm_head = None  # the CPU reduced-precision modes are Llama-family only

    # -- loading --------------------------------------------------------------------------
    def load_checkpoint(self, tensors) -> None:
        """Copy the checkpoint's tensors in: `tensors` yields (hub name without `language_model.`, float32
        tensor), e.g. `engine.m3.checkpoint.M3Checkpoint.items()`. Gemma norms get their `1 + w`; q/k/v,
        w1/w3 and gate/up are fused as they arrive. Every parameter must be written exactly once."""
        slots = self._slots()
        written: set[str] = set()
        with torch.no_grad():
            for name, t in tensors:
                target = slots.get(name)
                if target is None:
                    continue
                dst, norm = target
                dst.copy_(t + 1.0 if norm else t)
                written.add(name)
        missing = sorted(set(slots) - written)
        if missing:
            raise KeyError(f"checkpoint lacks tensor {missing[0]} ({len(missing)} missing)")

    def _slots(self) -> dict[str, tuple[torch.Tensor, bool]]:
        """hub tensor name -> (the view of our parameter it fills, whether it is a Gemma norm weight)."""
        cfg = self.cfg
        s: dict[str, tuple[torch.Tensor, bool]] = {"model.embed_tokens.weight": (self.embed, False),
                                                   "model.norm.weight": (self.norm, True)}
        if self.lm_head is not None:
            s["lm_head.weight"] = (self.lm_head, False)
        for i, L in enumerate(self.layers):
            p = f"model.layers.{i}."
            s[p + "input_layernorm.weight"] = (L.in_norm, True)
            s[p + "post_attention_layernorm.weight"] = (L.post_norm, True)
            q, k, v = L.qkv.split([L.q_size, L.kv_size, L.kv_size])
            s.update({p + "self_attn.q_proj.weight": (q, False), p + "self_attn.k_proj.weight": (k, False),
                      p + "self_attn.v_proj.weight": (v, False), p + "self_attn.o_proj.weight": (L.o_proj, False),
                      p + "self_attn.q_norm.weight": (L.q_norm, True), p + "self_attn.k_norm.weight": (L.k_norm, True)})
            if str(i) in self.index.layers:
                ix = self.index[i]
                s.update({p + "self_attn.index_q_proj.weight": (ix.wq, False),
                          p + "self_attn.index_k_proj.weight": (ix.wk, False),
                          p + "self_attn.index_q_norm.weight": (ix.q_norm, True),
                          p + "self_attn.index_k_norm.weight": (ix.k_norm, True)})
            if L.moe:
                m, b = L.mlp, p + "block_sparse_moe."
                inter = cfg.m3.moe_intermediate_size
                s[b + "gate.weight"] = (m.router, False)
                s[b + "e_score_correction_bias"] = (m.bias, False)
                for e in range(m.w13.shape[0]):
                    s[b + f"experts.{e}.w1.weight"] = (m.w13[e, :inter], False)
                    s[b + f"experts.{e}.w3.weight"] = (m.w13[e, inter:], False)
                    s[b + f"experts.{e}.w2.weight"] = (m.w2[e], False)
                s.update(_mlp_slots(m.shared, b + "shared_experts."))
            else:
                s.update(_mlp_slots(L.mlp, p + "mlp."))
        return s

    def prepare(self, device: torch.device) -> None:
        """After `.to(device)`: RoPE tables and the MoE implementation for the device."""
        self.rope = RotaryEmbedding(self.cfg, device, None, head_dim=self.cfg.m3.rotary_dim)
        impl = experts_impl(device)
        for L in self.layers:
            if L.moe:
                L.mlp.impl = impl

    setup_rope = prepare

    @property
    def supports_cuda_graphs(self) -> bool:
        """Decode steps are capturable when the MoE runs the Triton kernels (the torch path syncs)."""
        return all(L.mlp.impl == "triton" for L in self.layers if L.moe)

    def indexer(self, topk: int | None = None):
        """The `engine.attention.Indexer` of the checkpoint's own index branch (its `minimax_m3_sparse` layers);
        `topk` overrides the checkpoint's blocks per query."""
        from engine.attention.factory import Indexer

        self.index.msa = self.index.msa.replace(topk=topk)
        return Indexer(self.index.msa, self.index, PartialIndexRope())

    # -- forward --------------------------------------------------------------------------
    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta,
                      cache: KVCache, attn) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.rope(positions)
        delta = None
        for layer in self.layers:
            x, delta = layer(x, delta, cos, sin, meta, cache, attn, positions)
        return add_rms_norm(delta, self.norm, self.cfg.rms_eps, residual=x)[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.embed if self.lm_head is None else self.lm_head).float()


def _mlp_slots(mlp: DenseMLP, prefix: str) -> dict[str, tuple[torch.Tensor, bool]]:
    gate, up = mlp.gate_up.chunk(2)
    return {prefix + "gate_proj.weight": (gate, False), prefix + "up_proj.weight": (up, False),
            prefix + "down_proj.weight": (mlp.down, False)}


def _index_projections(cfg: ModelConfig):
    """The index projections of the sparse layers as `engine.msa.IndexProjections` (learned RMSNorms on,
    the model's eps); the full-attention layers are MSA's dense layers."""
    from engine.msa.config import MSAConfig
    from engine.msa.projections import IndexProjections

    m3 = cfg.m3
    msa = MSAConfig(block_size=m3.index_block_size, topk=m3.index_topk, d_idx=m3.index_head_dim,
                    dense_layers=m3.full_layers, index_norm=True)
    proj = IndexProjections(cfg, msa, eps=cfg.rms_eps)
    proj.requires_grad_(False)
    return proj
