"""FP32 torch references for the MSA indexer (msa-spec sections 2.2 and 2.3).

Math, for one request with ``kv_len`` keys and ``q_len`` queries (bottom-right aligned, so
query ``i`` sits at position ``pos = kv_len - q_len + i``), index head ``h`` (one per KV group):

* token score   ``s[i, h, j] = q_idx[i, h] . k_idx[j] / sqrt(d_idx)`` in fp32, visible iff ``j <= pos``;
* block score   ``M[i, h, b] = max_{j in block b, j <= pos} s[i, h, j]`` (-inf for invisible blocks);
* local block   ``L = pos // B``; candidates are the blocks ``b < L`` (all fully visible);
* selection     the top ``min(k - 1, L)`` candidates by score, descending, ties to the smaller id,
  then ``L`` in the next slot, then ``-1`` padding. Valid count = ``min(k, L + 1)``.
* selected LSE  ``logsumexp`` (natural log) of ``s[i, h, j]`` over the tokens ``j <= pos`` of the
  selected blocks.

Output layout is token-major: ids int32 ``[T, H, k]``, LSE fp32 ``[T, H]``. Block ids are logical
(block ``b`` covers the request's tokens ``[b*B, (b+1)*B)``).

FP8 and int8 index keys (``k_idx_scale`` given): the keys are dequantised exactly (``k8 * scale`` in fp32,
``kernels._common.fp8.dequantize_rows``) before the math above; with ``fp8_dot`` the queries are also
rounded to e4m3 per (token, head) row by the same rule and dequantised, which is what the kernel's
e4m3 x e4m3 dot scores; with int8 keys the queries are rounded to int8 per row (``kernels._common.int8``),
as the kernel's int8 x int8 dot scores them.

The references work in query chunks sized so that no ``[T, S]`` tensor is ever built: the largest
temporary is ``[chunk, H, S]`` with ``chunk * H * S <= _MAX_CHUNK_ELEMENTS``.
"""
from __future__ import annotations

import math

import torch

from kernels._common.fp8 import dequantize_rows, quantize_rows
from kernels._common.int8 import dequantized_int8_queries

_MAX_CHUNK_ELEMENTS = 1 << 24  # fp32 elements of the largest score temporary (64 MiB)


def request_block_scores(q: torch.Tensor, k: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block max scores of one request: q ``[Tr, H, d]``, k ``[Sr, d]`` -> fp32 ``[Tr, H, ceil(Sr/B)]``.

    Bottom-right aligned (query i at position ``Sr - Tr + i``); invisible tokens count as -inf,
    so blocks after the query's own block are -inf and the own block is scored on its visible part.
    Builds the full ``[Tr, H, Sr]`` score tensor: meant for tests at small sizes.
    """
    scores = _token_scores(q, k, q_start=k.shape[0] - q.shape[0])
    return _block_max(scores, block_size)


def _token_scores(q: torch.Tensor, k: torch.Tensor, q_start: int) -> torch.Tensor:
    """``[Tc, H, S]`` fp32 scaled scores with causally invisible entries set to -inf."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("thd,sd->ths", q.float(), k.float()) * scale
    pos = q_start + torch.arange(q.shape[0], device=q.device)
    key_pos = torch.arange(k.shape[0], device=q.device)
    visible = key_pos[None, :] <= pos[:, None]
    return scores.masked_fill(~visible[:, None, :], float("-inf"))


def _block_max(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[Tc, H, S]`` -> ``[Tc, H, n_blocks]`` max over each block (partial last block padded -inf)."""
    tc, h, s = scores.shape
    n_blocks = -(-s // block_size)
    pad = n_blocks * block_size - s
    if pad:
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    return scores.view(tc, h, n_blocks, block_size).amax(dim=-1)


def select_blocks(block_scores: torch.Tensor, local_block: torch.Tensor, topk: int) -> torch.Tensor:
    """The selection rule (module docstring) on ``[Tc, H, nb]`` block scores and ``[Tc]`` local block ids
    -> ``[Tc, H, topk]``; also the oracle's rule (`engine.attention.oracle`) on block attention masses."""
    tc, h, nb = block_scores.shape
    block_ids = torch.arange(nb, device=block_scores.device)
    candidate = block_ids[None, :] < local_block[:, None]  # [Tc, nb]
    ranked = block_scores.masked_fill(~candidate[:, None, :], float("-inf"))
    # stable descending sort keeps equal scores in ascending id order: ties go to the smaller id
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    n_hist = torch.clamp(local_block, max=topk - 1)  # [Tc] history blocks kept
    width = min(topk - 1, nb)
    ids = torch.full((tc, h, topk), -1, dtype=torch.int32, device=block_scores.device)
    slot = torch.arange(topk, device=block_scores.device)
    hist = order[..., :width].to(torch.int32)
    keep = slot[None, :width] < n_hist[:, None]
    ids[..., :width] = torch.where(keep[:, None, :], hist, ids[..., :width])
    local_slot = n_hist.long()  # local block goes right after the history blocks
    ids.scatter_(-1, local_slot[:, None, None].expand(tc, h, 1),
                 local_block.to(torch.int32)[:, None, None].expand(tc, h, 1))
    return ids


def _selected_lse(scores: torch.Tensor, ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """logsumexp of ``[Tc, H, S]`` masked scores over the tokens of the selected blocks -> ``[Tc, H]``."""
    tc, h, s = scores.shape
    key_block = torch.arange(s, device=scores.device) // block_size
    chosen = (key_block[None, None, None, :] == ids[..., None].long()).any(dim=2)  # [Tc, H, S]
    return torch.logsumexp(scores.masked_fill(~chosen, float("-inf")), dim=-1)


def indexer_request_reference(q: torch.Tensor, k: torch.Tensor, topk: int, block_size: int,
                              return_lse: bool = False):
    """One request: q ``[Tr, H, d]``, k ``[Sr, d]`` (``Sr >= Tr``) -> ids ``[Tr, H, topk]`` (, lse ``[Tr, H]``)."""
    tr, h, _ = q.shape
    sr = k.shape[0]
    if sr < tr:
        raise ValueError(f"kv length {sr} must be >= query length {tr} (bottom-right alignment)")
    q_start = sr - tr
    chunk = max(1, _MAX_CHUNK_ELEMENTS // max(1, h * sr))
    ids_parts, lse_parts = [], []
    for c0 in range(0, tr, chunk):
        qc = q[c0:c0 + chunk]
        scores = _token_scores(qc, k, q_start + c0)
        local = (q_start + c0 + torch.arange(qc.shape[0], device=q.device)) // block_size
        ids = select_blocks(_block_max(scores, block_size), local, topk)
        ids_parts.append(ids)
        if return_lse:
            lse_parts.append(_selected_lse(scores, ids, block_size))
    ids = torch.cat(ids_parts) if ids_parts else q.new_empty((0, h, topk), dtype=torch.int32)
    if not return_lse:
        return ids
    lse = torch.cat(lse_parts) if lse_parts else q.new_empty((0, h), dtype=torch.float32)
    return ids, lse


def indexer_varlen_reference(q_idx: torch.Tensor, k_idx: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             cu_seqlens_kv: torch.Tensor, topk: int, block_size: int = 128,
                             return_lse: bool = False):
    """Training form: contiguous packed keys.

    q_idx ``[T, H, d_idx]``, k_idx ``[S, d_idx]``, cu_seqlens_q / cu_seqlens_kv int ``[R+1]``
    (request r: queries ``q_idx[cu_q[r]:cu_q[r+1]]`` are the causal suffix of keys
    ``k_idx[cu_kv[r]:cu_kv[r+1]]``). Returns ids int32 ``[T, H, topk]`` with block ids local to each
    request, and with ``return_lse`` also fp32 ``[T, H]``.
    """
    cq, ckv = cu_seqlens_q.tolist(), cu_seqlens_kv.tolist()
    outs = [indexer_request_reference(q_idx[cq[r]:cq[r + 1]], k_idx[ckv[r]:ckv[r + 1]], topk,
                                      block_size, return_lse) for r in range(len(cq) - 1)]
    return _concat(outs, q_idx, topk, return_lse)


def gather_request_keys(k_idx_cache: torch.Tensor, page_table_row: torch.Tensor, kv_len: int,
                        k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Paged index keys ``[pages, B, d_idx]`` of one request -> contiguous ``[kv_len, d_idx]`` (fp8 / int8 keys
    with their scales ``[pages, B]``: dequantised, fp32)."""
    block_size = k_idx_cache.shape[1]
    n_blocks = -(-kv_len // block_size)
    pages = page_table_row[:n_blocks].long()
    keys = k_idx_cache[pages]
    if k_idx_scale is not None:
        keys = dequantize_rows(keys, k_idx_scale[pages])
    return keys.reshape(n_blocks * block_size, -1)[:kv_len]


def fp8_dot_queries(q_idx: torch.Tensor) -> torch.Tensor:
    """What the e4m3 x e4m3 dot scores with: each (token, head) row of q_idx rounded to e4m3 by the shared rule,
    dequantised (fp32)."""
    return dequantize_rows(*quantize_rows(q_idx))


def scored_queries(q_idx: torch.Tensor, key_dtype: torch.dtype, fp8_dot: bool) -> torch.Tensor:
    """The queries the kernel scores against keys of ``key_dtype``: rounded to e4m3 with ``fp8_dot``, to int8
    against int8 keys, else as given."""
    if fp8_dot:
        return fp8_dot_queries(q_idx)
    return dequantized_int8_queries(q_idx) if key_dtype == torch.int8 else q_idx


def indexer_paged_reference(q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, topk: int,
                            return_lse: bool = False, k_idx_scale: torch.Tensor | None = None,
                            fp8_dot: bool = False):
    """Inference form: q_idx ``[T, H, d_idx]``, k_idx_cache ``[pages, B, d_idx]`` (float8_e4m3fn with fp32
    ``k_idx_scale [pages, B]``), page_table int32 ``[R, max_pages]``, cu_seqlens_q ``[R+1]``, seq_lens_kv
    ``[R]`` (includes this chunk); ``fp8_dot``: q_idx rounded to e4m3 per row first (``fp8_dot_queries``); int8
    keys (with their scales): q_idx rounded to int8 per row (``scored_queries``).

    Returns logical block ids int32 ``[T, H, topk]`` (and fp32 selected LSE ``[T, H]``).
    """
    cq, lens = cu_seqlens_q.tolist(), seq_lens_kv.tolist()
    block_size = k_idx_cache.shape[1]
    q = scored_queries(q_idx, k_idx_cache.dtype, fp8_dot)
    outs = []
    for r in range(len(lens)):
        keys = gather_request_keys(k_idx_cache, page_table[r], lens[r], k_idx_scale)
        outs.append(indexer_request_reference(q[cq[r]:cq[r + 1]], keys, topk, block_size, return_lse))
    return _concat(outs, q_idx, topk, return_lse)


def paged_block_scores(q_idx: torch.Tensor, k_idx_cache: torch.Tensor, page_table: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, k_idx_scale: torch.Tensor | None = None,
                       fp8_dot: bool = False) -> torch.Tensor:
    """Block max scores for tests: fp32 ``[T, H, max_blocks]``, -inf where a block is invisible
    (or beyond the request). The own block is scored on its visible tokens only. FP8 keys and
    ``fp8_dot`` as in ``indexer_paged_reference``."""
    cq, lens = cu_seqlens_q.tolist(), seq_lens_kv.tolist()
    block_size = k_idx_cache.shape[1]
    max_blocks = max([-(-n // block_size) for n in lens], default=0)
    q = scored_queries(q_idx, k_idx_cache.dtype, fp8_dot)
    out = torch.full((q_idx.shape[0], q_idx.shape[1], max_blocks), float("-inf"), device=q_idx.device)
    for r in range(len(lens)):
        keys = gather_request_keys(k_idx_cache, page_table[r], lens[r], k_idx_scale)
        bs = request_block_scores(q[cq[r]:cq[r + 1]], keys, block_size)
        out[cq[r]:cq[r + 1], :, :bs.shape[-1]] = bs
    return out


def _concat(outs, q_idx: torch.Tensor, topk: int, return_lse: bool):
    h = q_idx.shape[1]
    if not return_lse:
        return torch.cat(outs) if outs else q_idx.new_empty((0, h, topk), dtype=torch.int32)
    if not outs:
        return q_idx.new_empty((0, h, topk), dtype=torch.int32), q_idx.new_empty((0, h), dtype=torch.float32)
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
