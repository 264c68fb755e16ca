"""CPU decode hot path: one attention call for the whole decode batch, and cache writes by row.

A decode step on the CPU used to cost, per layer and per request, two page gathers, a permute
copy and one SDPA call (8 requests x 30 layers = 240 SDPA calls and ~700 copies per step). Here
the step's metadata is built ONCE (`CpuDecodePlan.build`, from the host page table) and every
layer does: one `index_select` of K rows, one of V rows, two batched matmuls and a softmax.

Gathering by key row: the cache `[num_pages, Hkv, B, d]` viewed as `[num_pages * Hkv * B, d]`
has the key of (page, head h, offset o) at row `(page * Hkv + h) * B + o`; picking rows
`[R, Hkv, S]` gives `[R, Hkv, S, d]` with no further copy and no page padding. Keys past a
request's length are masked out; the result equals the per-request SDPA up to float
summation order.

`cache_rows`: where token t's K/V row of head h lives in the cache viewed as `[num_pages * Hkv * B, d]`
(`(page * Hkv + h) * B + offset`), so one `index_copy_` writes a layer's K (or V) for the step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.meta import AttentionMeta
from kernels._common.fp8 import dequantize_rows, quantize_rows


def cache_rows(slot_pages: torch.Tensor, slot_offsets: torch.Tensor, num_kv_heads: int, page_size: int) -> torch.Tensor:
    """slot_pages, slot_offsets int64 `[T]` -> int64 `[T * Hkv]` flat row ids (token-major, head-minor)."""
    heads = torch.arange(num_kv_heads, dtype=torch.long, device=slot_pages.device)
    return ((slot_pages[:, None] * num_kv_heads + heads) * page_size + slot_offsets[:, None]).reshape(-1)


def rope_and_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, rows: torch.Tensor, num_heads: int, num_kv_heads: int,
                   k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                   rotation: torch.Tensor | None = None) -> torch.Tensor:
    """qkv `[T, (Hq + 2 Hkv) d]` -> q `[T, Hq, d]` with RoPE; K (rotated) and V written at `rows`.

    Same math as `engine.gpu.ops.rope_cache_ref` (rotate-half RoPE), with q and k rotated in one
    pass and each cache written by one `index_copy_`. A bfloat16 qkv (the CPU fast linears) is
    rotated in float32 (its product with the float32 cos/sin promotes); q comes back in the cache dtype.
    An FP8 cache (with `k_scale`, `v_scale` `[P, Hkv, B]`): K and V rows quantised (`quantize_rows`), the codes
    and scales written at `rows`; q comes back in float32. `rotation` (fp8-hadamard's `KVCache.k_rotation`): q and
    K multiplied by it after RoPE, in float32."""
    d = k_cache.shape[-1]
    t, nqk = qkv.shape[0], num_heads + num_kv_heads
    qk = qkv[:, : nqk * d].view(t, nqk, d)
    half = d // 2
    c, s = cos[:, None, :], sin[:, None, :]
    rot = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)
    qk = qk * c + rot * s
    if rotation is not None:
        qk = qk.float() @ rotation
    if k_scale is not None and v_scale is not None:
        k8, ks = quantize_rows(qk[:, num_heads:].reshape(t * num_kv_heads, d))
        v8, vs = quantize_rows(qkv[:, nqk * d:].reshape(t * num_kv_heads, d))
        # index_copy_ has no fp8 kernel on the CPU: copy the codes as bytes
        k_cache.view(torch.uint8).view(-1, d).index_copy_(0, rows, k8.view(torch.uint8))
        v_cache.view(torch.uint8).view(-1, d).index_copy_(0, rows, v8.view(torch.uint8))
        k_scale.view(-1).index_copy_(0, rows, ks)
        v_scale.view(-1).index_copy_(0, rows, vs)
        return qk[:, :num_heads].float()
    # the cast (when the dtypes differ) or the reshape copies the strided slice: one op each
    k_cache.view(-1, d).index_copy_(0, rows, qk[:, num_heads:].to(k_cache.dtype).reshape(t * num_kv_heads, d))
    v_cache.view(-1, d).index_copy_(0, rows, qkv[:, nqk * d:].to(v_cache.dtype).reshape(t * num_kv_heads, d))
    return qk[:, :num_heads].to(k_cache.dtype)


@dataclass
class CpuDecodePlan:
    """Batched decode attention for R requests with one query token each.

    `key_rows` int64 `[R * Hkv * S]` (S = longest request): cache rows, in the cache viewed as
    `[num_pages * Hkv * B, d]`, of every request's keys (positions past a request's length repeat
    its last key and are masked); `key_bias` float32 `[R, 1, 1, S]` (0 or -inf), None when every
    request has length S."""

    key_rows: torch.Tensor
    key_bias: torch.Tensor | None
    num_requests: int
    num_kv_heads: int
    keys: int
    scale: float

    @staticmethod
    def build(meta: AttentionMeta, num_kv_heads: int, page_size: int, scale: float) -> CpuDecodePlan:
        lens = torch.as_tensor(meta.kv_lens, dtype=torch.long)
        s = int(max(meta.kv_lens))
        pt = meta.page_table_host if meta.page_table_host is not None else meta.page_table.cpu()
        pos = torch.minimum(torch.arange(s)[None, :], lens[:, None] - 1)  # [R, S], clamped inside each request
        pages = torch.gather(pt.long(), 1, pos // page_size)  # [R, S]
        heads = torch.arange(num_kv_heads, dtype=torch.long)[None, :, None]
        rows = ((pages[:, None, :] * num_kv_heads + heads) * page_size + (pos % page_size)[:, None, :]).reshape(-1)
        bias = None
        if min(meta.kv_lens) != s:
            inside = torch.arange(s)[None, :] < lens[:, None]
            bias = torch.zeros(len(meta.kv_lens), 1, 1, s).masked_fill(~inside[:, None, None, :], float("-inf"))
        return CpuDecodePlan(rows, bias, len(meta.kv_lens), num_kv_heads, s, scale)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale: torch.Tensor | None = None,
            v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """q `[R, Hq, d]`, caches `[num_pages, Hkv, B, d]` -> `[R, Hq, d]` in the cache dtype (softmax over
        each request's keys).

        Plain matmul/softmax/matmul: for one query per head this beats the CPU flash-SDPA kernel.
        A bfloat16 cache (CPU reduced-precision modes) runs both matmuls in bf16 (fp32 accumulation,
        scores rounded to bf16) with the scale, mask and softmax in float32. An FP8 cache: the gathered rows
        are dequantised with their gathered scales (`k_scale`, `v_scale`) to q's dtype, the result in q's dtype."""
        r, hkv, d = self.num_requests, self.num_kv_heads, k_cache.shape[-1]
        g = q.shape[1] // hkv
        k = k_cache.view(-1, d).index_select(0, self.key_rows).view(r * hkv, self.keys, d)
        v = v_cache.view(-1, d).index_select(0, self.key_rows).view(r * hkv, self.keys, d)
        if k_scale is not None and v_scale is not None:
            ks = k_scale.view(-1).index_select(0, self.key_rows).view(r * hkv, self.keys)
            vs = v_scale.view(-1).index_select(0, self.key_rows).view(r * hkv, self.keys)
            k, v = dequantize_rows(k, ks, q.dtype), dequantize_rows(v, vs, q.dtype)
        scores = torch.bmm(q.to(k.dtype).reshape(r * hkv, g, d), k.transpose(1, 2)).float().mul_(self.scale)
        if self.key_bias is not None:
            scores.view(r, hkv, g, self.keys).add_(self.key_bias)
        return torch.bmm(torch.softmax(scores, dim=-1).to(v.dtype), v).view(r, hkv * g, d)
