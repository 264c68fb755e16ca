"""Exact MSA attention on the CPU over the selected blocks only.

A request with several queries (a prompt, a chunk after a prefix) is taken block-major: every valid
(query, KV group, block) choice is an item; the items are sorted by (group, block) and cut into pieces
of at most `PIECE` items of one (group, block). A piece is one matmul of its queries (all `G` heads of
the group) against its block's `B` keys, the causal mask on the queries' own block, a softmax within
the block and one matmul with its values. The per-block results of a query are then merged by their
log-sum-exp (the split softmax of flash decoding). The work is proportional to the selected blocks
(`k*B` keys per query, plus the padding of each piece), not to the context: adjacent queries of the
shipped indexer share few blocks (a 128-query tile's union is most of the context at k = 16), so a
union per query tile would read nearly all of it.

Requests with one query (decode steps) run as one batched call, each query against its own `k`
blocks (`[R*Hkv, k*B, d]`), as the decode reference does.

Same keys and the same softmax as the references (`kernels/sparse_prefill/naive.py`,
`kernels/decode/naive.py`), up to float rounding. A query whose selection is empty gets a zero output,
as the kernels do. Keys and values past the request's length are zeroed after the gather: they are
masked out, but a NaN there would reach the output through 0 * NaN.

An FP8 cache (`k_scale`, `v_scale` `[pages, Hkv, B]`): each gathered block of codes is dequantised with its
scales to q's dtype (`kernels._common.fp8.dequantize_rows`, the references' rule) before the matmuls.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.meta import AttentionMeta
from engine.kv_fp8 import read_rows

PIECE = 128  # items (queries of one group on one block) per matmul
_MAX_SCORES = 1 << 23  # fp32 score elements per batch of pieces (32 MiB)
# torch's CPU flash attention (what F.scaled_dot_product_attention runs on a CPU), for its log-sum-exp
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def sparse_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMeta,
                     ids: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """q `[T, Hq, d]`, caches `[pages, Hkv, B, d]` (block = page; FP8 with scales `[pages, Hkv, B]`), ids
    `[T, Hkv, k]` logical block ids (-1 padded) -> `[T, Hq, d]` in q's dtype."""
    block = k_cache.shape[2]
    out = torch.empty_like(q)
    single, start = [], 0
    for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
        if ql == 1:
            single.append(r)
        elif ql:
            pages = torch.as_tensor(meta.page_lists[r][:-(-kl // block)], dtype=torch.long, device=q.device)
            pos = torch.arange(kl - ql, kl, device=q.device)
            out[start:start + ql] = _request(q[start:start + ql], k_cache, v_cache, pages, ids[start:start + ql],
                                             pos, kl, scale, k_scale, v_scale)
        start += ql
    if single:
        rows = torch.as_tensor(meta.cu_seqlens_q[single].long(), device=q.device)
        out[rows] = _decode(q[rows], k_cache, v_cache, meta.page_table[single].long(), ids[rows],
                            [meta.kv_lens[r] for r in single], scale, k_scale, v_scale)
    return out


def _request(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pages: torch.Tensor, ids: torch.Tensor,
             pos: torch.Tensor, kv_len: int, scale: float, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One request's queries `[ql, Hq, d]` at positions `pos [ql]`, ids `[ql, Hkv, k]` -> `[ql, Hq, d]`."""
    ql, hq, d = q.shape
    _, hkv, block, _ = k_cache.shape
    dtype = k_cache.dtype if k_scale is None else q.dtype  # of the matmuls: the cache's, or q's for FP8 codes
    group, n_blocks, topk = hq // hkv, pages.shape[0], ids.shape[-1]
    dev = q.device
    idx = ids.long()
    own = pos // block
    valid = (idx >= 0) & (idx <= own[:, None, None])  # an id past the query's own block sees no key
    chosen = torch.zeros(hkv, n_blocks + 1, ql, dtype=torch.bool, device=dev)
    chosen[torch.arange(hkv, device=dev)[None, :, None], torch.where(valid, idx, n_blocks),
           torch.arange(ql, device=dev)[:, None, None]] = True
    chosen = chosen[:, :n_blocks]
    g, blk, t = chosen.nonzero(as_tuple=True)  # the items, in (group, block, query) order
    if t.numel() == 0:
        return torch.zeros_like(q)
    rows = ql * hkv
    row = t * hkv + g
    nth = chosen.cumsum(1, dtype=torch.int32)[g, blk, t].long() - 1  # the item is its row's nth block
    # segments of one (group, block, own block or not), in item order (a block's own-block queries come
    # first: positions ascend); the own block's items get the causal mask
    seg = (g * n_blocks + blk) * 2 + (blk != own[t]).long()
    counts = torch.bincount(seg, minlength=hkv * n_blocks * 2)
    n_pieces = (counts + PIECE - 1) // PIECE
    slot = ((torch.cumsum(n_pieces, 0) - n_pieces) * PIECE)[seg] + torch.arange(seg.numel(), device=dev) - (
        torch.cumsum(counts, 0) - counts)[seg]  # each item's place in the padded pieces [P, PIECE]
    n_slots = int(n_pieces.sum()) * PIECE
    row_of_slot = torch.full((n_slots,), rows, dtype=torch.long, device=dev)  # padding: a zero query row
    row_of_slot[slot] = row
    dest_of_slot = torch.full((n_slots,), rows * topk, dtype=torch.long, device=dev)  # padding: a spare entry
    dest_of_slot[slot] = row * topk + nth
    piece_seg = torch.repeat_interleave(torch.arange(hkv * n_blocks * 2, device=dev), n_pieces)
    piece_g, piece_b, piece_own = piece_seg // (2 * n_blocks), piece_seg // 2 % n_blocks, piece_seg % 2 == 0
    pos_of_row = torch.cat([pos.repeat_interleave(hkv), pos.new_full((1,), -1)])

    qg = torch.cat([q.to(dtype).reshape(rows, group * d), q.new_zeros((1, group * d), dtype=dtype)])
    # per (row, i-th selected block of the row); a row's entries past its count stay zero, weight 0
    part_o = torch.empty(rows * topk + 1, group * d, dtype=dtype, device=dev)
    part_lse = torch.full((rows * topk + 1, group), float("-inf"), dtype=torch.float32, device=dev)
    unused = torch.arange(topk, device=dev) >= chosen.sum(1).T.reshape(rows, 1)
    part_o.index_fill_(0, unused.view(-1).nonzero(as_tuple=True)[0], 0.0)
    tail = kv_len - (n_blocks - 1) * block
    per_batch = max(1, _MAX_SCORES // (PIECE * group * block))
    for own_pieces in (False, True):
        chosen_pieces = (piece_own == own_pieces).nonzero(as_tuple=True)[0]
        for b0 in range(0, chosen_pieces.numel(), per_batch):
            pc = chosen_pieces[b0:b0 + per_batch]
            n_p, pb = pc.numel(), piece_b[pc]
            at = (pages[pb], piece_g[pc])
            keys = read_rows(k_cache[at], None if k_scale is None else k_scale[at], dtype)  # [P, B, d]
            vals = read_rows(v_cache[at], None if v_scale is None else v_scale[at], dtype)
            if tail < block:  # past kv_len: masked, but zeroed so that no stale NaN gets through 0 * NaN
                last = (pb == n_blocks - 1).nonzero(as_tuple=True)[0]
                keys[last, tail:] = 0
                vals[last, tail:] = 0
            slots = (pc[:, None] * PIECE + torch.arange(PIECE, device=dev)).view(-1)
            r = row_of_slot[slots]
            mask = None
            if own_pieces:  # keys after the query: -inf
                key_pos = pb[:, None] * block + torch.arange(block, device=dev)  # [P, B]
                late = key_pos[:, None, :] > pos_of_row[r].view(n_p, PIECE, 1)  # [P, PIECE, B]
                mask = torch.zeros(n_p, PIECE, group, block, dtype=dtype, device=dev)
                mask.masked_fill_(late[:, :, None, :], float("-inf"))
                mask = mask.view(n_p, 1, PIECE * group, block)
            o, lse = _flash(qg.index_select(0, r).view(n_p, 1, PIECE * group, d), keys[:, None], vals[:, None],
                            attn_mask=mask, scale=scale)
            dest = dest_of_slot[slots]  # padding slots all write the spare entry
            part_o.index_copy_(0, dest, o.view(n_p * PIECE, group * d))
            part_lse.index_copy_(0, dest, lse.view(n_p * PIECE, group))
    # merge each row's blocks by their log-sum-exp (flash decoding's split softmax)
    weight = torch.softmax(part_lse[:-1].view(rows, topk, group), dim=1).nan_to_num_(0.0)  # none: NaN -> 0
    mixed = torch.bmm(weight.to(dtype).transpose(1, 2), part_o[:-1].view(rows, topk, group * d))  # [rows, G, G*d]
    out = mixed.view(rows, group, group, d).diagonal(dim1=1, dim2=2)  # head h's weights on head h's outputs
    return out.permute(0, 2, 1).reshape(ql, hq, d).to(q.dtype)


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
            ids: torch.Tensor, kv_lens: list[int], scale: float, k_scale: torch.Tensor | None = None,
            v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """One query per request: q `[R, Hq, d]`, page_table `[R, max_pages]`, ids `[R, Hkv, k]` -> `[R, Hq, d]`."""
    n, hq, d = q.shape
    _, hkv, block, _ = k_cache.shape
    group, topk = hq // hkv, ids.shape[-1]
    pos = torch.as_tensor(kv_lens, dtype=torch.long, device=q.device) - 1  # [R]
    idx = ids.long()
    valid = (idx >= 0) & (idx <= (pos // block)[:, None, None])  # [R, Hkv, k]
    safe = torch.where(valid, idx, 0)
    phys = page_table[torch.arange(n, device=q.device)[:, None, None], safe]  # [R, Hkv, k]
    heads = torch.arange(hkv, device=q.device)[None, :, None]
    dtype = k_cache.dtype if k_scale is None else q.dtype
    keys = read_rows(k_cache[phys, heads], None if k_scale is None else k_scale[phys, heads], dtype)  # [R,Hkv,k,B,d]
    vals = read_rows(v_cache[phys, heads], None if v_scale is None else v_scale[phys, heads], dtype)
    key_pos = safe[..., None] * block + torch.arange(block, device=q.device)  # [R, Hkv, k, B]
    late = key_pos > pos[:, None, None, None]
    where = late.nonzero(as_tuple=True)
    if where[0].numel():
        keys[where] = 0
        vals[where] = 0
    mask = (valid[..., None] & ~late).reshape(n * hkv, 1, topk * block)
    qg = q.to(keys.dtype).reshape(n * hkv, group, d)
    o = F.scaled_dot_product_attention(qg, keys.view(n * hkv, topk * block, d), vals.view(n * hkv, topk * block, d),
                                       attn_mask=mask, scale=scale)  # [R*Hkv, G, d]
    o = o.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return o.reshape(n, hq, d).to(q.dtype)
