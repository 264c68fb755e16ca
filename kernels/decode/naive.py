"""FP32 torch references for MSA paged decode (msa-spec sections 2.3, 5.1, 5.3).

Independent of the Triton kernels and of the prefill references; they are the CPU path of the
engine and the ground truth of the tests.

Shapes (R requests, each with ``q_len`` new tokens, T = R * q_len, page size B):

* ``page_table`` int32 ``[R, max_pages]``: logical page j of request r lives in physical page
  ``page_table[r, j]``; ``seq_lens`` int32 ``[R]`` includes the q_len new tokens.
* query i of request r (token ``t = r * q_len + i``) sits at ``pos = seq_lens[r] - q_len + i``;
  its own (local) page is ``pos // B``.
* ``k_cache``/``v_cache`` ``[num_pages, Hkv, B, d]`` (float8_e4m3fn with per-token fp32 scales
  ``k_scale``/``v_scale [num_pages, Hkv, B]``, dequantised exactly by ``kernels._common.fp8.dequantize_rows``);
  ``k_idx_cache`` ``[num_pages, B, d_idx]`` (optionally float8_e4m3fn with a per-token fp32 scale ``[num_pages, B]``).

Decode indexer: page p < local is scored by the max raw dot product ``max_t q_idx . k_idx[t]``
(no 1/sqrt(d) scale: same ranking); the best ``k - 1`` pages (score descending, ties to the
smaller id) then the local page; with ``local + 1 <= k`` candidates the ids are ``0..local``.
Pages at or after the local page are never read.
"""
from __future__ import annotations

import math

import torch

from kernels._common.fp8 import FP8, dequantize_rows
from kernels._common.int8 import dequantized_int8_queries


def _positions(seq_lens: torch.Tensor, q_len: int) -> torch.Tensor:
    """int64 ``[R, q_len]`` causal position of every query token."""
    offs = torch.arange(q_len, device=seq_lens.device, dtype=torch.int64)
    return seq_lens.to(torch.int64)[:, None] - q_len + offs[None, :]


def decode_indexer_ref(
    q_idx: torch.Tensor,
    k_idx_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len: int,
    topk: int,
    k_idx_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k logical page ids, int32 ``[T, H, topk]`` token-major, local page last, -1 padded.

    q_idx ``[T, H, d_idx]`` (H = one index head per KV group); k_idx_cache ``[P, B, d_idx]``; scaled keys
    (fp8 / int8) times ``k_idx_scale [P, B]``. int8 keys score the queries rounded to int8 per row
    (``kernels/_common/int8.py``), as the kernel does.
    """
    if k_idx_cache.dtype == torch.int8:
        q_idx = dequantized_int8_queries(q_idx)
    num_req = seq_lens.shape[0]
    page = k_idx_cache.shape[1]
    heads = q_idx.shape[1]
    out = torch.full((num_req * q_len, heads, topk), -1, dtype=torch.int32, device=q_idx.device)
    pos = _positions(seq_lens, q_len)
    for r in range(num_req):
        local = (pos[r] // page).tolist()
        n_hist = max(local)  # pages before the last query's own page: the only ones ever read
        keys = None
        if n_hist > 0 and max(local) + 1 > topk:
            phys = page_table[r, :n_hist].long()
            keys = k_idx_cache[phys].float()  # [n_hist, B, d]
            if k_idx_scale is not None:
                keys = keys * k_idx_scale[phys].float()[..., None]
        for i in range(q_len):
            t = r * q_len + i
            loc = local[i]
            if loc + 1 <= topk:
                out[t, :, : loc + 1] = torch.arange(loc + 1, dtype=torch.int32, device=out.device)
                continue
            q = q_idx[t].float()  # [H, d]
            scores = torch.einsum("hd,pbd->hpb", q, keys[:loc]).amax(dim=-1)  # [H, loc]
            # stable sort keeps ascending ids among equal scores
            order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
            out[t, :, : topk - 1] = order[:, : topk - 1].to(torch.int32)
            out[t, :, topk - 1] = loc
    return out


def _values(cache: torch.Tensor, scale: torch.Tensor | None, name: str) -> torch.Tensor:
    """fp32 values of (already gathered) cache rows: fp8 rows times their scales, others widened."""
    if (cache.dtype == FP8) != (scale is not None):
        raise ValueError(f"{name}: a float8_e4m3fn cache needs its fp32 scale [num_pages, Hkv, B], and only it")
    return dequantize_rows(cache, scale) if scale is not None else cache.float()


def _gather_request_pages(cache: torch.Tensor, scale: torch.Tensor | None, page_table: torch.Tensor, r: int,
                          n_pages: int, name: str):
    """``[Hkv, n_pages * B, d]`` fp32 keys or values of request r's first n_pages logical pages."""
    phys = page_table[r, :n_pages].long()
    pages = _values(cache[phys], None if scale is None else scale[phys], name)  # [n, Hkv, B, d]
    n, hkv, b, d = pages.shape
    return pages.permute(1, 0, 2, 3).reshape(hkv, n * b, d)


def _softmax_attend(q, keys, values, visible, scale):
    """q ``[N, Hkv, G, d]``, keys/values ``[N, Hkv, S, d]``, visible bool ``[N, Hkv, S]``.

    Returns fp32 out ``[N, Hkv, G, d]`` and natural-log LSE ``[N, Hkv, G]``; a query that sees no
    key gets out 0 and LSE -inf.
    """
    # invisible keys/values are zeroed first: they may hold anything (NaN poison in the tests)
    keys = keys.masked_fill(~visible[..., None], 0.0)
    values = values.masked_fill(~visible[..., None], 0.0)
    logits = torch.einsum("nhgd,nhsd->nhgs", q, keys) * scale
    logits = logits.masked_fill(~visible[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse.masked_fill(torch.isinf(lse), 0.0)[..., None])
    probs = probs.masked_fill(~visible[:, :, None, :], 0.0)
    out = torch.einsum("nhgs,nhsd->nhgd", probs, values)
    return out, lse


def sparse_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    topk_ids: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len: int,
    softmax_scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the selected pages only.

    q ``[T, Hq, d]``, topk_ids int32 ``[T, Hkv, k]`` logical page ids (-1 = unused slot); fp8 caches
    come with ``k_scale``/``v_scale [P, Hkv, B]`` fp32.
    Token ``j`` of a selected page is visible iff ``j <= pos``. Returns fp32 out ``[T, Hq, d]``
    and natural-log LSE ``[T, Hq]`` (-inf and out 0 where nothing is visible).
    """
    tokens, hq, d = q.shape
    _, hkv, page, _ = k_cache.shape
    group = hq // hkv
    k = topk_ids.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    pos = _positions(seq_lens, q_len).reshape(-1)  # [T]
    req = torch.arange(tokens, device=q.device) // q_len
    ids = topk_ids.long()
    valid = ids >= 0  # [T, Hkv, k]
    safe = ids.clamp(min=0)
    phys = page_table.long()[req[:, None, None], safe]  # [T, Hkv, k]
    head = torch.arange(hkv, device=q.device)[None, :, None]
    ks = None if k_scale is None else k_scale[phys, head]
    vs = None if v_scale is None else v_scale[phys, head]
    keys = _values(k_cache[phys, head], ks, "k_cache").reshape(tokens, hkv, k * page, d)
    values = _values(v_cache[phys, head], vs, "v_cache").reshape(tokens, hkv, k * page, d)
    tok_pos = safe[..., None] * page + torch.arange(page, device=q.device)  # [T, Hkv, k, B]
    visible = (valid[..., None] & (tok_pos <= pos[:, None, None, None])).reshape(tokens, hkv, -1)
    out, lse = _softmax_attend(q.float().view(tokens, hkv, group, d), keys, values, visible, scale)
    return out.reshape(tokens, hq, d), lse.reshape(tokens, hq)


def dense_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    q_len: int,
    softmax_scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over each request's whole paged history (key j visible iff j <= pos).

    q ``[T, Hq, d]``; fp8 caches come with ``k_scale``/``v_scale [P, Hkv, B]`` fp32. Returns fp32 out
    ``[T, Hq, d]`` and natural-log LSE ``[T, Hq]``.
    """
    tokens, hq, d = q.shape
    _, hkv, page, _ = k_cache.shape
    group = hq // hkv
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    pos = _positions(seq_lens, q_len)
    out = torch.empty(tokens, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(tokens, hq, dtype=torch.float32, device=q.device)
    for r in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[r])
        n_pages = -(-seq_len // page)
        keys = _gather_request_pages(k_cache, k_scale, page_table, r, n_pages, "k_cache")  # [Hkv, S, d]
        values = _gather_request_pages(v_cache, v_scale, page_table, r, n_pages, "v_cache")
        key_pos = torch.arange(keys.shape[1], device=q.device)
        visible = key_pos[None, :] <= pos[r][:, None]  # [q_len, S]
        qr = q[r * q_len : (r + 1) * q_len].float().view(q_len, hkv, group, d)
        o, l = _softmax_attend(
            qr,
            keys[None].expand(q_len, -1, -1, -1),
            values[None].expand(q_len, -1, -1, -1),
            visible[:, None, :].expand(-1, hkv, -1),
            scale,
        )
        out[r * q_len : (r + 1) * q_len] = o.reshape(q_len, hq, d)
        lse[r * q_len : (r + 1) * q_len] = l.reshape(q_len, hq)
    return out, lse
