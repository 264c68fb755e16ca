"""Dense paged GQA attention.

CPU: torch SDPA per request over its gathered pages (the reference the MSA paths are compared
to); CPU decode steps: one batched attention over the step's requests (`engine.cpu_decode`). GPU decode: our split-K paged kernel through `kernels.decode.DenseDecodePlan` (plan once per
step, run per layer; CUDA-graph capturable). GPU prefill chunks: SDPA (flash / memory-efficient
kernels) per request and KV group over the gathered pages.
Queries `[T, Hq, d]` packed per `meta.cu_seqlens_q`; causal with bottom-right alignment
(query i of a request sits at position kv_len - q_len + i).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.meta import AttentionMeta, DecodeShapes


def gather_kv(cache: torch.Tensor, pages: list[int] | torch.Tensor, kv_len: int) -> torch.Tensor:
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


def prefill_sdpa_gpu(qr: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One request on a GPU: qr `[Hq, ql, d]`, k/v `[Hkv, kl, d]` -> `[Hq, ql, d]`, bottom-right causal.

    One SDPA call per KV group with K/V repeated over the group's heads (flash kernel for a
    whole prompt, `causal_lower_right` (memory-efficient kernel) for a chunk after a prefix)."""
    from torch.nn.attention.bias import causal_lower_right

    hq, ql, d = qr.shape
    hkv, kl = k.shape[0], k.shape[1]
    g = hq // hkv
    out = torch.empty_like(qr)
    for j in range(hkv):
        kj = k[j:j + 1].expand(g, kl, d).contiguous()[None]
        vj = v[j:j + 1].expand(g, kl, d).contiguous()[None]
        qj = qr[j * g:(j + 1) * g][None]
        if ql == kl:
            o = F.scaled_dot_product_attention(qj, kj, vj, is_causal=ql > 1, scale=scale)
        else:
            o = F.scaled_dot_product_attention(qj, kj, vj, attn_mask=causal_lower_right(ql, kl), scale=scale)
        out[j * g:(j + 1) * g] = o[0]
    return out


class DenseAttention:
    kind = "dense"
    supports_cuda_graphs = True

    def __init__(self, scale: float):
        self.scale = scale
        self._plans: dict = {}

    def plan_decode(self, meta: AttentionMeta, shapes: DecodeShapes, key="eager") -> None:
        """GPU decode step: copy lengths and pages into the plan for `key` (outside graph capture).
        CPU decode step: one batched attention for all requests (`CpuDecodePlan`), unless padding
        to the longest request would more than double the keys read (then per-request SDPA)."""
        if shapes.device.type == "cpu":
            lens = meta.kv_lens
            if len(lens) * max(lens) <= 2 * sum(lens):
                from engine.cpu_decode import CpuDecodePlan

                meta.decode_plan = CpuDecodePlan.build(meta, shapes.num_kv_heads, shapes.page_size, self.scale)
            return
        from kernels.decode import DenseDecodePlan

        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = DenseDecodePlan(
                shapes.num_heads, shapes.num_kv_heads, shapes.head_dim, shapes.page_size, device=shapes.device,
                dtype=shapes.dtype, softmax_scale=self.scale)
        plan.plan(meta.seq_lens_host, meta.page_table_host, 1)
        meta.decode_plan = plan

    def __call__(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMeta, **_: object) -> torch.Tensor:
        if meta.decode_plan is not None:
            return meta.decode_plan.run(q, k_cache, v_cache)
        out = torch.empty_like(q)
        start = 0
        for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens)):
            pages = meta.page_lists[r]
            k = gather_kv(k_cache, pages, kl)
            v = gather_kv(v_cache, pages, kl)
            qr = q[start:start + ql].transpose(0, 1)  # [Hq, ql, d]
            if q.is_cuda:
                out[start:start + ql] = prefill_sdpa_gpu(qr, k, v, self.scale).transpose(0, 1)
            else:
                mask = causal_mask(ql, kl, q.device)
                o = F.scaled_dot_product_attention(qr[None].to(k.dtype), k[None], v[None], attn_mask=mask,
                                                   scale=self.scale, enable_gqa=True)
                out[start:start + ql] = o[0].transpose(0, 1)
            start += ql
        return out
