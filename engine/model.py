"""Llama-family GQA decoder (Llama, Mistral, Qwen2, Qwen3, SmolLM2), our own code.

Tokens are packed `[T]` across requests; K/V go to the paged cache; attention goes through
one dispatch object (`engine.attention`). Q/K/V and gate/up projections are fused into one
matmul each. Logits are computed only for the rows the caller asks for. The small ops between
the matmuls go through `engine.gpu.ops` (torch references on the CPU, fused Triton kernels on a
GPU: residual add + RMSNorm, RoPE + KV-cache write, SwiGLU).

CPU-only fast paths (gated on the device): one `index_copy_` per cache write (`engine.cpu_decode`),
`F.rms_norm`, and the reduced-precision matmuls of `engine.cpu_weights` when attached
(`fast_linears` per layer, `fast_lm_head`); without them the CPU runs the exact float32 weights.
Fast linears return bf16: the residual add promotes it back to float32, SwiGLU stays bf16 into the
next matmul, and q/k are rotated in float32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.meta import AttentionMeta
from engine.config import ModelConfig
from engine.cpu_decode import cache_rows, rope_and_write
from engine.gpu.ops import rms_norm as rms_norm_op
from engine.gpu.ops import rms_norm_ref, rope_cache, silu_mul
from engine.kv_cache import KVCache, rotate_qk, write_kv
from engine.rope import RotaryEmbedding, apply_rope


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_ref(x, w, eps)


def add_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """`engine.gpu.ops.rms_norm` on a GPU; on the CPU one fused `F.rms_norm` (same float32 math)."""
    if x.is_cuda:
        return rms_norm_op(x, w, eps, residual=residual)
    if residual is None:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    s = x + residual
    return F.rms_norm(s, (s.shape[-1],), w, eps), s


def whole(x: torch.Tensor) -> torch.Tensor:
    """A layer's `reduce` in one process: its o_proj and MLP outputs are already whole (`engine.parallel`
    sets an all-reduce of the ranks' partial sums instead)."""
    return x


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, idx: int):
        super().__init__()
        self.idx, self.cfg = idx, cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.in_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.post_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.qkv = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size, h), requires_grad=False)
        self.qkv_bias = nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size), requires_grad=False) \
            if cfg.qkv_bias else None
        self.q_norm = nn.Parameter(torch.ones(d), requires_grad=False) if cfg.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(d), requires_grad=False) if cfg.qk_norm else None
        self.o_proj = nn.Parameter(torch.empty(h, self.q_size), requires_grad=False)
        self.gate_up = nn.Parameter(torch.empty(2 * cfg.intermediate_size, h), requires_grad=False)
        self.down = nn.Parameter(torch.empty(h, cfg.intermediate_size), requires_grad=False)
        # CPU reduced-precision matmuls by matrix name ("qkv", "o_proj", "gate_up", "down"), or None
        self.fast_linears: dict | None = None
        self.reduce = whole  # o_proj and MLP outputs -> their sum over tensor-parallel ranks

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x `[T, in]` @ the named fused matrix (its CPU fast version when attached)."""
        if self.fast_linears is not None:
            return self.fast_linears[name](x)
        return F.linear(x, getattr(self, name), self.qkv_bias if name == "qkv" else None)

    def qkv_proj(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x `[T, hidden]` (already normed) -> q `[T, Hq, d]`, k, v `[T, Hkv, d]` with RoPE."""
        cfg, d = self.cfg, self.cfg.head_dim
        qkv = self.linear("qkv", x)
        if self.fast_linears is not None:  # a CPU fast linear returns bf16: q/k norms and RoPE in float32
            qkv = qkv.float()
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, d)
        k = k.view(-1, cfg.num_kv_heads, d)
        v = v.view(-1, cfg.num_kv_heads, d)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, cfg.rms_eps), rms_norm(k, self.k_norm, cfg.rms_eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _q_and_cache(self, h: torch.Tensor, cos, sin, meta: AttentionMeta, kc, vc, ks=None, vs=None,
                     k_rotation: torch.Tensor | None = None) -> torch.Tensor:
        """Project, rotate, write K/V into the cache slots (an FP8 cache: codes into kc/vc, scales into ks/vs);
        return q `[T, Hq, d]`. `k_rotation` (`KVCache.k_rotation`, fp8-hadamard): q and K multiplied by it after
        RoPE, K quantised from the fp32 product (in the same fused pass, or after `qkv_proj`'s q/k norms)."""
        cfg = self.cfg
        if self.q_norm is None:  # fused RoPE (+ rotation) + cache write (one kernel on a GPU, rows on a CPU)
            qkv = self.linear("qkv", h)
            if meta.cache_rows is not None:
                return rope_and_write(qkv, cos, sin, kc, vc, meta.cache_rows, cfg.num_heads, cfg.num_kv_heads,
                                      ks, vs, k_rotation)
            return rope_cache(qkv, cos, sin, kc, vc, meta.slot_pages, meta.slot_offsets, cfg.num_heads,
                              cfg.num_kv_heads, k_scale=ks, v_scale=vs, rotation=k_rotation)
        q, k, v = self.qkv_proj(h, cos, sin)
        if k_rotation is not None:
            q, k = rotate_qk(q, k, k_rotation)
        write_kv(kc, vc, ks, vs, meta.slot_pages, meta.slot_offsets, k, v)
        return q

    def forward(self, x, delta, cos, sin, meta: AttentionMeta, cache: KVCache, attn, positions):
        """Residual stream x `[T, hidden]` plus the previous layer's pending output `delta` (None for
        the first layer); returns (x, this layer's MLP output) so the add fuses into the next norm."""
        eps = self.cfg.rms_eps
        if delta is None:
            h = add_rms_norm(x, self.in_norm, eps)
        else:
            h, x = add_rms_norm(delta, self.in_norm, eps, residual=x)
        kc, vc = cache.k[self.idx], cache.v[self.idx]
        ks, vs = cache.scales(self.idx)
        q = self._q_and_cache(h, cos, sin, meta, kc, vc, ks, vs, cache.k_rotation)
        o = attn(self.idx, q, kc, vc, meta, hidden=h, cos=cos, sin=sin, cache=cache, positions=positions,
                 k_scale=ks, v_scale=vs)
        o = self.reduce(self.linear("o_proj", o.reshape(o.shape[0], -1)))
        h, x = add_rms_norm(o, self.post_norm, eps, residual=x)
        return x, self.reduce(self.linear("down", silu_mul(self.linear("gate_up", h))))


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size), requires_grad=False)
        self.lm_head = None if cfg.tie_embeddings else nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.hidden_size), requires_grad=False)
        self.rope: RotaryEmbedding | None = None
        self.freq_factors: torch.Tensor | None = None
        self.fast_lm_head = None  # CPU reduced-precision lm_head (engine.cpu_weights), or None

    def load_weights(self, w: dict[str, torch.Tensor]) -> None:
        """Take HF-named float32 tensors; fuse Q/K/V and gate/up."""
        def take(name: str) -> torch.Tensor:
            if name not in w:
                raise KeyError(f"checkpoint lacks tensor {name}")
            return w[name]

        with torch.no_grad():
            self.embed.copy_(take("model.embed_tokens.weight"))
            self.norm.copy_(take("model.norm.weight"))
            if self.lm_head is not None:
                self.lm_head.copy_(w.get("lm_head.weight", w["model.embed_tokens.weight"]))
            for i, L in enumerate(self.layers):
                p = f"model.layers.{i}."
                L.in_norm.copy_(take(p + "input_layernorm.weight"))
                L.post_norm.copy_(take(p + "post_attention_layernorm.weight"))
                L.qkv.copy_(torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
                if L.qkv_bias is not None:
                    L.qkv_bias.copy_(torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"]))
                if L.q_norm is not None:
                    L.q_norm.copy_(take(p + "self_attn.q_norm.weight"))
                    L.k_norm.copy_(take(p + "self_attn.k_norm.weight"))
                L.o_proj.copy_(take(p + "self_attn.o_proj.weight"))
                L.gate_up.copy_(torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]))
                L.down.copy_(take(p + "mlp.down_proj.weight"))
        self.freq_factors = w.get("rope_freq_factors")

    def setup_rope(self, device: torch.device) -> None:
        self.rope = RotaryEmbedding(self.cfg, device, self.freq_factors)

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMeta,
                      cache: KVCache, attn) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.rope(positions)
        if not x.is_cuda and meta.cache_rows is None:  # CPU: cache rows of this step, once for all layers
            meta.cache_rows = cache_rows(meta.slot_pages, meta.slot_offsets, self.cfg.num_kv_heads, cache.page_size)
        delta = None
        for layer in self.layers:
            x, delta = layer(x, delta, cos, sin, meta, cache, attn, positions)
        return add_rms_norm(delta, self.norm, self.cfg.rms_eps, residual=x)[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.fast_lm_head is not None and not h.is_cuda:
            return self.fast_lm_head(h).float()
        w = self.embed if self.lm_head is None else self.lm_head
        return F.linear(h, w).float()
