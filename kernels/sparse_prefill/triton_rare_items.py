"""Triton kernels that bucket the rare (token, block) pairs into items of up to ``TQ`` tokens (``rare_items.py``).

A pair is (token ``t``, KV head ``g``, slot ``j``) with ``RARE[t, g, j] >= 0``: the ``j``-th block of the
token's KV group that its tile left to the rare pass. Its bucket is ``((j * HKV + g) * R + req) * P + blk``
(round ``j``, KV head, the token's request, the logical block): the tokens of one bucket read the same
K / V rows, and no token appears twice in one round. ``R`` (requests) and ``P`` (page-table width) are
runtime arguments: as constexprs every new batch shape compiled the kernels again (~0.4 s a time on an H200).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _pair_buckets(RARE, TOK_REQ, t_off, g, n_tok, stride_rt, stride_rh, HKV: tl.constexpr, R,
                  P, TOPK: tl.constexpr, BT: tl.constexpr):
    """The ``[BT, TOPK]`` pairs of tokens ``t_off ..`` and KV head ``g``: token, bucket, logical block,
    request and whether the pair exists."""
    t = t_off + tl.arange(0, BT)
    tok_ok = t < n_tok
    j = tl.arange(0, TOPK)
    blk = tl.load(RARE + t.to(tl.int64)[:, None] * stride_rt + g * stride_rh + j[None, :], mask=tok_ok[:, None],
                  other=-1)
    req = tl.load(TOK_REQ + t, mask=tok_ok, other=0)
    ok = blk >= 0
    bucket = ((j[None, :] * HKV + g) * R + req[:, None]) * P + tl.maximum(blk, 0)
    return t, bucket, blk, req, ok


@triton.jit
def _rare_count_kernel(RARE, TOK_REQ, COUNT, n_tok, stride_rt, stride_rh, HKV: tl.constexpr, R,
                       P, TOPK: tl.constexpr, BT: tl.constexpr):
    """Pass 1, one program per (``BT`` tokens, KV head): ``COUNT[bucket] += 1`` for each pair."""
    g = tl.program_id(1)
    _, bucket, _, _, ok = _pair_buckets(RARE, TOK_REQ, tl.program_id(0) * BT, g, n_tok, stride_rt, stride_rh,
                                        HKV, R, P, TOPK, BT)
    tl.atomic_add(COUNT + bucket, 1, mask=ok, sem="relaxed")


@triton.jit
def _rare_scatter_kernel(RARE, TOK_REQ, PT, FILL, ITEM_OFF, ITEM_TOK, ITEM_G, ITEM_REQ, ITEM_BLK, ITEM_PAGE, n_tok,
                         stride_rt, stride_rh, stride_pt, HKV: tl.constexpr, R, P,
                         TOPK: tl.constexpr, BT: tl.constexpr, TQ: tl.constexpr):
    """Pass 2: each pair takes the next slot of its bucket (``FILL``); slot ``s`` is position ``s % TQ``
    of the bucket's item ``ITEM_OFF[bucket] + s // TQ``. The pair in position 0 writes the item's KV
    head, request, logical block and physical page."""
    g = tl.program_id(1)
    t, bucket, blk, req, ok = _pair_buckets(RARE, TOK_REQ, tl.program_id(0) * BT, g, n_tok, stride_rt, stride_rh,
                                            HKV, R, P, TOPK, BT)
    slot = tl.atomic_add(FILL + bucket, 1, mask=ok, sem="relaxed")
    item = tl.load(ITEM_OFF + bucket, mask=ok, other=0) + slot // TQ
    tl.store(ITEM_TOK + item.to(tl.int64) * TQ + slot % TQ, t[:, None] + bucket * 0, mask=ok)
    first = ok & (slot % TQ == 0)
    tl.store(ITEM_G + item, bucket * 0 + g, mask=first)
    tl.store(ITEM_REQ + item, req[:, None] + bucket * 0, mask=first)
    tl.store(ITEM_BLK + item, blk, mask=first)
    page = tl.load(PT + req[:, None].to(tl.int64) * stride_pt + tl.maximum(blk, 0), mask=first, other=0)
    tl.store(ITEM_PAGE + item, page, mask=first)
