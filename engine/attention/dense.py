"""Dense paged GQA attention (torch SDPA per request over its gathered pages).

This is the `dense` path on every device and the reference the MSA paths are compared to.
Queries `[T, Hq, d]` packed per `meta.cu_seqlens_q`; causal with bottom-right alignment
(query i of a request sits at position kv_len - q_len + i).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.meta import AttentionMeta


def gather_kv(cache: torch.Tensor, pages: list[int], kv_len: int) -> torch.Tensor:
    """`[num_pages, H, B, d]` -> contiguous `[H, kv_len, d]` of one request."""
    idx = torch.as_tensor(pages, device=cache.device)
    g = cache.index_select(0, idx)  # [n, H, B, d]
    h, d = g.shape[1], g.shape[3]
    return g.permute(1, 0, 2, 3).reshape(h, -1, d)[:, :kv_len]


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    if q_len == 1:
        return None
    qpos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    kpos = torch.arange(kv_len, device=device)[None, :]
    return kpos <= qpos


class DenseAttention:
    kind = "dense"

    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMeta, **_: object) -> torch.Tensor:
        out = torch.empty_like(q)
        start = 0
        for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens)):
            pages = meta.page_lists[r]
            k = gather_kv(k_cache, pages, kl)
            v = gather_kv(v_cache, pages, kl)
            qr = q[start:start + ql].transpose(0, 1)  # [Hq, ql, d]
            mask = causal_mask(ql, kl, q.device)
            o = F.scaled_dot_product_attention(qr[None], k[None], v[None], attn_mask=mask,
                                               scale=self.scale, enable_gqa=True)
            out[start:start + ql] = o[0].transpose(0, 1)
            start += ql
        return out
