"""Exact MSA attention on the CPU as masked dense attention.

The kernel references (`kernels/sparse_prefill/naive.py`) gather k*B keys per query, which is
clear but slow on a CPU (4-20x dense SDPA at 2K tokens). Here each request's keys are
gathered once, the selected blocks of every (query, KV group) become a boolean mask over the
keys (plus the causal mask inside the own block), and one SDPA call runs over the masked
scores. The result is the same attention as the references (same keys, same softmax), up to
float rounding; `--attention msa-ref` keeps the references themselves. Memory: one bool mask
`[Hq, q_len, kv_len]` per request and chunk.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.dense import gather_kv
from engine.attention.meta import AttentionMeta


def selection_mask(ids: torch.Tensor, kv_len: int, block: int, group: int) -> torch.Tensor:
    """ids `[q_len, Hkv, k]` (-1 padded logical blocks) -> bool `[Hkv*G, q_len, kv_len]`, causal."""
    ql, hkv, _ = ids.shape
    n_blocks = -(-kv_len // block)
    sel = torch.zeros(ql, hkv, n_blocks + 1, dtype=torch.bool, device=ids.device)
    idx = torch.where(ids >= 0, ids.long(), torch.full_like(ids, n_blocks, dtype=torch.long))
    sel.scatter_(2, idx, True)
    keys = sel[:, :, :n_blocks].repeat_interleave(block, dim=2)[:, :, :kv_len]  # [ql, Hkv, S]
    qpos = torch.arange(kv_len - ql, kv_len, device=ids.device)[:, None, None]
    keys &= torch.arange(kv_len, device=ids.device)[None, None, :] <= qpos
    return keys.permute(1, 0, 2).repeat_interleave(group, dim=0)  # [Hq, ql, S]


def masked_sparse_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta,
                            ids: torch.Tensor, scale: float, block: int) -> torch.Tensor:
    """q `[T, Hq, d]`, caches `[pages, Hkv, B, d]`, ids `[T, Hkv, k]` -> `[T, Hq, d]`.

    A query whose selection is empty gets a zero output (as the kernels do)."""
    out = torch.zeros_like(q)
    group = q.shape[1] // k_cache.shape[1]
    start = 0
    for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
        pages = meta.page_lists[r]
        k, v = gather_kv(k_cache, pages, kl), gather_kv(v_cache, pages, kl)
        mask = selection_mask(ids[start:start + ql], kl, block, group)
        o = F.scaled_dot_product_attention(q[start:start + ql].transpose(0, 1)[None], k[None], v[None],
                                           attn_mask=mask[None], scale=scale, enable_gqa=True)[0]
        empty = ~mask.any(-1)  # [Hq, ql]
        out[start:start + ql] = o.masked_fill(empty[..., None], 0.0).transpose(0, 1)
        start += ql
    return out
