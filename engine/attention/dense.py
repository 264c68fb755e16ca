"""Dense paged GQA attention, one class per device (`engine.attention.make_attention` picks it).

`DenseAttention` (CPU): torch SDPA per request over its gathered pages (the reference the MSA
paths are compared to); decode steps: one batched attention over the step's requests
(`engine.cpu_decode.CpuDecodePlan`).
`GpuDenseAttention`: decode through our split-K paged kernel, `kernels.decode.DenseDecodePlan`
(plan once per step, run per layer; CUDA-graph capturable); prefill chunks: SDPA (flash /
memory-efficient kernels) per request and KV group over the gathered pages.
Queries `[T, Hq, d]` packed per `meta.cu_seqlens_q`; causal with bottom-right alignment
(query i of a request sits at position kv_len - q_len + i).
An FP8 cache (`k_scale`, `v_scale` given): prefill gathers the request's codes and scales and dequantises them
to q's dtype before SDPA (`engine.kv_fp8.read_rows`); decode dequantises the gathered rows on the CPU
(`CpuDecodePlan.run`) and runs the FP8 kernel of `DenseDecodePlan(kv_dtype=fp8)` on a GPU.
"""
from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from engine.attention.meta import AttentionMeta, DecodeShapes
from engine.kv_cache import as_bytes
from engine.kv_fp8 import read_rows


def gather_kv(cache: torch.Tensor, pages: list[int] | torch.Tensor, kv_len: int) -> torch.Tensor:
    """`[num_pages, H, B, d]` -> contiguous `[H, kv_len, d]` of one request."""
    idx = torch.as_tensor(pages, device=cache.device)
    g = as_bytes(cache).index_select(0, idx)  # [n, H, B, d] (FP8 codes moved as bytes)
    h, d = g.shape[1], g.shape[3]
    return g.permute(1, 0, 2, 3).reshape(h, -1, d)[:, :kv_len].view(cache.dtype)


def gather_scales(scale: torch.Tensor | None, pages: list[int] | torch.Tensor, kv_len: int) -> torch.Tensor | None:
    """`gather_kv` of a scale tensor `[num_pages, H, B]` -> `[H, kv_len]` (None stays None)."""
    return None if scale is None else gather_kv(scale[..., None], pages, kv_len)[..., 0]


def gather_pages(cache: torch.Tensor, page_table: torch.Tensor, pages: int) -> torch.Tensor:
    """`[num_pages, H, B, d]` and a page table `[R, >= pages]` (-1 past a request's pages) -> `[R, H, pages * B,
    d]`: every request's first `pages` pages in order at once; the -1 slots read page 0 (mask them by length)."""
    g = as_bytes(cache)[page_table[:, :pages].long().clamp(min=0)]  # [R, pages, H, B, d]
    r, h, d = g.shape[0], g.shape[2], g.shape[4]
    return g.permute(0, 2, 1, 3, 4).reshape(r, h, -1, d).view(cache.dtype)


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
    """Dense attention on the CPU (see the module docstring)."""

    kind = "dense"
    supports_cuda_graphs = False

    def __init__(self, scale: float):
        self.scale = scale

    def plan_decode(self, meta: AttentionMeta, shapes: DecodeShapes, key="eager") -> None:
        """One batched attention for all requests of the step (`CpuDecodePlan`), unless padding to the
        longest request would more than double the keys read (then per-request SDPA)."""
        lens = meta.kv_lens
        if len(lens) * max(lens) <= 2 * sum(lens):
            from engine.cpu_decode import CpuDecodePlan

            meta.decode_plan = CpuDecodePlan.build(meta, shapes.num_kv_heads, shapes.page_size, self.scale)

    def __call__(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMeta, *, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                 **_: object) -> torch.Tensor:
        if meta.decode_plan is not None:
            if k_scale is None:
                return meta.decode_plan.run(q, k_cache, v_cache)
            return meta.decode_plan.run(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale)
        out = torch.empty_like(q)
        start = 0
        for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
            pages = meta.page_lists[r]
            k = read_rows(gather_kv(k_cache, pages, kl), gather_scales(k_scale, pages, kl), q.dtype)
            v = read_rows(gather_kv(v_cache, pages, kl), gather_scales(v_scale, pages, kl), q.dtype)
            qr = q[start:start + ql].transpose(0, 1)  # [Hq, ql, d]
            out[start:start + ql] = self._attend(qr, k, v).transpose(0, 1)
            start += ql
        return out

    def _attend(self, qr: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One request: qr `[Hq, ql, d]`, k/v `[Hkv, kl, d]` -> `[Hq, ql, d]`, bottom-right causal."""
        mask = causal_mask(qr.shape[1], k.shape[1], qr.device)
        return F.scaled_dot_product_attention(qr[None].to(k.dtype), k[None], v[None], attn_mask=mask,
                                              scale=self.scale, enable_gqa=True)[0]


class GpuDenseAttention(DenseAttention):
    """Dense attention on a CUDA device (see the module docstring)."""

    supports_cuda_graphs = True

    def __init__(self, scale: float, impl: Literal["triton", "torch"] = "triton"):
        super().__init__(scale)
        self.impl = impl  # of the decode plan; "torch" (its reference) only to check it off a GPU
        self._plans: dict = {}

    def plan_decode(self, meta: AttentionMeta, shapes: DecodeShapes, key="eager") -> None:
        """Copy lengths and pages into the plan for `key` (outside graph capture)."""
        from kernels.decode import DenseDecodePlan

        plan = self._plans.get(key)
        if plan is None:
            fp8 = {} if shapes.kv_dtype is None else {"kv_dtype": shapes.kv_dtype}  # the FP8 kernel
            plan = self._plans[key] = DenseDecodePlan(
                shapes.num_heads, shapes.num_kv_heads, shapes.head_dim, shapes.page_size, device=shapes.device,
                dtype=shapes.dtype, softmax_scale=self.scale, impl=self.impl, **fp8)
        plan.plan(meta.seq_lens_host, meta.page_table_host, 1)
        meta.decode_plan = plan

    def _attend(self, qr: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return prefill_sdpa_gpu(qr, k, v, self.scale)
