"""FP32 torch references for MSA sparse attention over the paged KV cache (msa-spec sections 4, 5.1-5.3).

For query token t of request r at position ``pos = seq_lens_kv[r] - q_len_r + i`` (bottom-right
aligned), query head h of KV group ``g = h // G``:

    S(t, g) = { j : j // B in topk_ids[t, g, :valid], j <= pos }
    out[t, h] = sum_{j in S} softmax_j(scale * q[t, h] . k[j, g]) v[j, g]
    lse[t, h] = logsumexp_{j in S}(scale * q[t, h] . k[j, g])      (natural log, fp32)

Key j of logical block b lives in ``k_cache[page_table[r, b], g, j - b*B]``. Entries ``-1`` are
padding. An empty S gives ``out = 0`` and ``lse = -inf``. Works for prefill, chunked prefill and
decode (q_len 1..16) alike. Computes in fp32 and returns ``out`` in q's dtype.

FP8 (e4m3) K/V caches come with fp32 ``k_scale`` / ``v_scale [pages, Hkv, B]`` (``kernels._common.fp8``:
value = x8 * scale) and are dequantised exactly. ``q8kv8=True`` instead models the Q8KV8 kernels'
arithmetic (``triton_sparse_attention``), so a kernel can be held to a tight bound:

* q rounded to e4m3 per (token, head) row by ``quantize_rows``; scores ``(q8 . k8) * q_scale * k_scale *
  scale * log2(e)`` (base 2);
* the softmax reference ``m = ceil(max visible score)``: an integer, so the kernels' running reference
  (also ceiled) differs from it by a power of two and every rounding below is the same (a power-of-two
  factor commutes with e4m3 rounding in its normal range);
* ``p = exp2(s - m)`` summed in fp32 for the normaliser; for the PV product each ``step`` keys of a block
  (the kernel's loop step) take ``vmax`` = their largest ``v_scale`` (keys at or past ``seq_lens_kv``
  excluded, as the kernels load them as 0; 1 if none is positive) and ``e4m3(p * (v_scale * (256 / vmax)))``
  multiplies v8, the result times ``vmax / 256``.
"""
from __future__ import annotations

import math

import torch

from kernels._common.fp8 import FP8, dequantize_rows, quantize_rows
from kernels._common.validate import check_kv_scales

_MAX_CHUNK_ELEMENTS = 1 << 24  # elements of the gathered K (and V) temporary per chunk
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
P_RANGE = 256.0  # the kernels' e4m3 probabilities lie in [0, 256] (e4m3's max is 448; a power of two)


def sparse_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               seq_lens_kv: torch.Tensor, topk_ids: torch.Tensor,
                               scale: float | None = None, *, k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None, q8kv8: bool = False,
                               step: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[T, Hq, d]``, k_cache / v_cache ``[pages, Hkv, B, d]`` (float8_e4m3fn with fp32 ``k_scale`` /
    ``v_scale [pages, Hkv, B]``), page_table int ``[R, max_pages]``, cu_seqlens_q ``[R+1]``,
    seq_lens_kv ``[R]``, topk_ids int ``[T, Hkv, k]`` logical block ids.

    ``q8kv8``: the kernels' Q8KV8 arithmetic (fp8 caches only; see the module docstring), ``step`` keys
    per v-scale group (default: the block). Returns ``(out [T, Hq, d] in q.dtype, lse [T, Hq] fp32)``.
    Assumes valid, unique ids.
    """
    t_total, hq, d = q.shape
    _, hkv, block, _ = k_cache.shape
    fp8 = check_kv_scales("sparse prefill reference", k_cache, v_cache, k_scale, v_scale)
    if q8kv8 and not fp8:
        raise ValueError("sparse_attention_reference: q8kv8=True models fp8 K/V; pass float8_e4m3fn caches "
                         "and their scales")
    step = step or block
    if block % step:
        raise ValueError(f"sparse_attention_reference: step must divide the block size {block}, got {step}")
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
            kv = _gather(k_cache, v_cache, k_scale, v_scale, page_table[r], topk_ids[t0:t1])
            if q8kv8:
                o, l = _chunk_q8kv8(q[t0:t1], kv, topk_ids[t0:t1], pos, lens[r], scale, group, step)
            else:
                o, l = _chunk_attention(q[t0:t1], kv, topk_ids[t0:t1], pos, scale, group)
            out[t0:t1], lse[t0:t1] = o, l
    return out.to(q.dtype), lse


def _gather(k_cache, v_cache, k_scale, v_scale, pt_row, ids):
    """The selected blocks of one request's tokens: (K, V ``[Tc, Hkv, k, B, d]`` as stored, their scales
    ``[Tc, Hkv, k, B]`` or None)."""
    hkv = k_cache.shape[1]
    pages = pt_row.long()[ids.long().clamp(min=0)]  # [Tc, Hkv, k]
    heads = torch.arange(hkv, device=ids.device)[None, :, None]
    ks = k_scale[pages, heads] if k_scale is not None else None
    vs = v_scale[pages, heads] if v_scale is not None else None
    return k_cache[pages, heads], v_cache[pages, heads], ks, vs


def _visible(ids, pos, block):
    """[Tc, Hkv, k, B]: key selected (valid slot) and at or before the token's position; and key positions."""
    key_pos = ids.long()[..., None] * block + torch.arange(block, device=ids.device)  # [Tc, Hkv, k, B]
    return (ids >= 0)[..., None] & (key_pos <= pos[:, None, None, None]), key_pos


def _chunk_attention(q, kv, ids, pos, scale, group):
    """Tokens of one request: q ``[Tc, Hq, d]``, ids ``[Tc, Hkv, k]``, pos ``[Tc]`` -> fp32 out, lse
    (fp8 K/V dequantised exactly)."""
    tc, hq, d = q.shape
    k_sel, v_sel, ks, vs = kv
    hkv, block = k_sel.shape[1], k_sel.shape[3]
    keys = dequantize_rows(k_sel, ks) if ks is not None else k_sel.float()  # [Tc, Hkv, k, B, d]
    vals = dequantize_rows(v_sel, vs) if vs is not None else v_sel.float()
    visible, _ = _visible(ids, pos, block)
    qg = q.float().view(tc, hkv, group, d)
    scores = torch.einsum("tghd,tgkbd->tghkb", qg, keys) * scale  # [Tc, Hkv, G, k, B]
    scores = scores.masked_fill(~visible[:, :, None], float("-inf")).flatten(-2)  # [Tc, Hkv, G, k*B]
    lse = torch.logsumexp(scores, dim=-1)  # -inf when nothing is visible
    probs = torch.exp(scores - lse[..., None].clamp(min=torch.finfo(torch.float32).min))
    probs = torch.nan_to_num(probs, nan=0.0)
    out = torch.einsum("tghs,tgsd->tghd", probs, vals.flatten(2, 3))
    return out.reshape(tc, hq, d), lse.reshape(tc, hq)


def _chunk_q8kv8(q, kv, ids, pos, kv_len, scale, group, step):
    """``_chunk_attention`` in the Q8KV8 kernels' arithmetic (the module docstring)."""
    tc, hq, d = q.shape
    k8, v8, ks, vs = kv
    hkv, topk, block = k8.shape[1], k8.shape[2], k8.shape[3]
    visible, key_pos = _visible(ids, pos, block)
    q8, q_scale = quantize_rows(q)  # [Tc, Hq, d], [Tc, Hq]
    raw = torch.einsum("tghd,tgkbd->tghkb", q8.float().view(tc, hkv, group, d), k8.float())
    s = raw * (q_scale.view(tc, hkv, group)[..., None, None] * (scale * _LOG2E)) * ks[:, :, None]
    s = s.masked_fill(~visible[:, :, None], float("-inf")).flatten(-2)  # [Tc, Hkv, G, k*B]
    m = s.amax(dim=-1).ceil()
    m_ref = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    p = torch.exp2(s - m_ref[..., None])  # 0 where not visible
    l = p.sum(-1)
    lse = torch.where(l > 0, (m_ref + torch.log2(l.clamp(min=1e-30))) * _LN2, float("-inf"))
    vs_in = torch.where((ids >= 0)[..., None] & (key_pos < kv_len), vs, 0.0).view(tc, hkv, topk, block // step, step)
    vmax = vs_in.amax(-1, keepdim=True)
    vmax = torch.where(vmax > 0, vmax, 1.0)
    c = (vs_in * (P_RANGE / vmax)).view(tc, hkv, 1, topk * block)
    back = (vmax / P_RANGE).expand_as(vs_in).reshape(tc, hkv, 1, topk * block)
    pv = (p * c).to(FP8).float() * back
    out = torch.einsum("tghs,tgsd->tghd", pv, v8.float().flatten(2, 3)) / torch.where(l > 0, l, 1.0)[..., None]
    return out.reshape(tc, hq, d), lse.reshape(tc, hq)


def dense_causal_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           seq_lens_kv: torch.Tensor, scale: float | None = None, *,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Dense causal GQA attention over the same paged cache, through torch SDPA, fp32 ``[T, Hq, d]``;
    fp8 caches (with ``k_scale`` / ``v_scale``) dequantised exactly: the dense FP8 reference.

    Equals the sparse op when every visible block is selected (a free test of the sparse path).
    """
    t_total, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    check_kv_scales("dense prefill reference", k_cache, v_cache, k_scale, v_scale)
    out = torch.zeros((t_total, hq, d), dtype=torch.float32, device=q.device)
    cq, lens = cu_seqlens_q.tolist(), seq_lens_kv.tolist()
    for r in range(len(lens)):
        q_len, kv_len = cq[r + 1] - cq[r], lens[r]
        n_blocks = -(-kv_len // block)
        pages = page_table[r, :n_blocks].long()
        kp = dequantize_rows(k_cache[pages], k_scale[pages]) if k_scale is not None else k_cache[pages].float()
        vp = dequantize_rows(v_cache[pages], v_scale[pages]) if v_scale is not None else v_cache[pages].float()
        k = kp.permute(1, 0, 2, 3).reshape(hkv, n_blocks * block, d)[:, :kv_len]
        v = vp.permute(1, 0, 2, 3).reshape(hkv, n_blocks * block, d)[:, :kv_len]
        qr = q[cq[r]:cq[r + 1]].float().transpose(0, 1)  # [Hq, q_len, d]
        pos = kv_len - q_len + torch.arange(q_len, device=q.device)
        mask = torch.arange(kv_len, device=q.device)[None, :] <= pos[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(
            qr, k.repeat_interleave(hq // hkv, 0), v.repeat_interleave(hq // hkv, 0),
            attn_mask=mask, scale=scale)
        out[cq[r]:cq[r + 1]] = o.transpose(0, 1)
    return out
