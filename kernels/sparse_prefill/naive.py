"""FP32 torch reference for MSA sparse attention over the paged KV cache (msa-spec sections 4, 5.1-5.3).

For query token t of request r at position ``pos = seq_lens_kv[r] - q_len_r + i`` (bottom-right
aligned), query head h of KV group ``g = h // G``:

    S(t, g) = { j : j // B in topk_ids[t, g, :valid], j <= pos }
    out[t, h] = sum_{j in S} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
    lse[t, h] = logsumexp_{j in S}(scale * q[t, h] . k[j, g])      (natural log, fp32)

Key j of logical block b lives in ``k_cache[page_table[r, b], g, j - b*B]``. Entries ``-1`` are
padding. An empty S gives ``out = 0`` and ``lse = -inf``. Works for prefill, chunked prefill and
decode (q_len 1..16) alike. Computes in fp32 and returns ``out`` in q's dtype.
"""
from __future__ import annotations

import math

import torch

_MAX_CHUNK_ELEMENTS = 1 << 24  # elements of the gathered K (and V) temporary per chunk


def sparse_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               seq_lens_kv: torch.Tensor, topk_ids: torch.Tensor,
                               scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[T, Hq, d]``, k_cache / v_cache ``[pages, Hkv, B, d]``, page_table int ``[R, max_pages]``,
    cu_seqlens_q ``[R+1]``, seq_lens_kv ``[R]``, topk_ids int ``[T, Hkv, k]`` logical block ids.

    Returns ``(out [T, Hq, d] in q.dtype, lse [T, Hq] fp32)``. Assumes valid, unique ids.
    """
    t_total, hq, d = q.shape
    _, hkv, block, _ = k_cache.shape
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros((t_total, hq, d), dtype=torch.float32, device=q.device)
    lse = torch.full((t_total, hq), float("-inf"), dtype=torch.float32, device=q.device)
    cq, lens = cu_seqlens_q.tolist(), seq_lens_kv.tolist()
    topk = topk_ids.shape[-1]
    chunk = max(1, _MAX_CHUNK_ELEMENTS // max(1, hkv * topk * block * d))
    for r in range(len(lens)):
        q_len = cq[r + 1] - cq[r]
        for c0 in range(0, q_len, chunk):
            t0, t1 = cq[r] + c0, cq[r] + min(q_len, c0 + chunk)
            pos = lens[r] - q_len + c0 + torch.arange(t1 - t0, device=q.device)
            o, l = _chunk_attention(q[t0:t1], k_cache, v_cache, page_table[r], pos,
                                    topk_ids[t0:t1], scale, group)
            out[t0:t1], lse[t0:t1] = o, l
    return out.to(q.dtype), lse


def _chunk_attention(q, k_cache, v_cache, pt_row, pos, ids, scale, group):
    """Tokens of one request: q ``[Tc, Hq, d]``, ids ``[Tc, Hkv, k]``, pos ``[Tc]`` -> fp32 out, lse."""
    tc, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    valid = ids >= 0  # [Tc, Hkv, k]
    pages = pt_row.long()[ids.long().clamp(min=0)]  # [Tc, Hkv, k]
    heads = torch.arange(hkv, device=q.device)[None, :, None]
    keys = k_cache[pages, heads].float()  # [Tc, Hkv, k, B, d]
    vals = v_cache[pages, heads].float()
    key_pos = ids.long()[..., None] * block + torch.arange(block, device=q.device)  # [Tc, Hkv, k, B]
    visible = valid[..., None] & (key_pos <= pos[:, None, None, None])
    qg = q.float().view(tc, hkv, group, d)
    scores = torch.einsum("tghd,tgkbd->tghkb", qg, keys) * scale  # [Tc, Hkv, G, k, B]
    scores = scores.masked_fill(~visible[:, :, None], float("-inf")).flatten(-2)  # [Tc, Hkv, G, k*B]
    lse = torch.logsumexp(scores, dim=-1)  # -inf when nothing is visible
    probs = torch.exp(scores - lse[..., None].clamp(min=torch.finfo(torch.float32).min))
    probs = torch.nan_to_num(probs, nan=0.0)
    out = torch.einsum("tghs,tgsd->tghd", probs, vals.flatten(2, 3))
    return out.reshape(tc, hq, d), lse.reshape(tc, hq)


def dense_causal_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           seq_lens_kv: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Dense causal GQA attention over the same paged cache, through torch SDPA, fp32 ``[T, Hq, d]``.

    Equals the sparse op when every visible block is selected (a free test of the sparse path).
    """
    t_total, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros((t_total, hq, d), dtype=torch.float32, device=q.device)
    cq, lens = cu_seqlens_q.tolist(), seq_lens_kv.tolist()
    for r in range(len(lens)):
        q_len, kv_len = cq[r + 1] - cq[r], lens[r]
        n_blocks = -(-kv_len // block)
        pages = page_table[r, :n_blocks].long()
        k = k_cache[pages].float().permute(1, 0, 2, 3).reshape(hkv, n_blocks * block, d)[:, :kv_len]
        v = v_cache[pages].float().permute(1, 0, 2, 3).reshape(hkv, n_blocks * block, d)[:, :kv_len]
        qr = q[cq[r]:cq[r + 1]].float().transpose(0, 1)  # [Hq, q_len, d]
        pos = kv_len - q_len + torch.arange(q_len, device=q.device)
        mask = torch.arange(kv_len, device=q.device)[None, :] <= pos[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            qr, k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0),
            attn_mask=mask, scale=scale)
        out[cq[r]:cq[r + 1]] = o.transpose(0, 1)
    return out
