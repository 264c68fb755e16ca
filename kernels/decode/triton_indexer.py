"""Triton paged decode indexer: split over pages, running top-(k-1) per split, then a merge.

Stage 1, grid ``(R, S)``: program (r, s) owns a contiguous slice of request r's history pages
``[0, L_last)`` (``L_last`` = own page of its last query; slice length ``ceil(L_last / S)``, read
from ``seq_lens`` in the kernel, so the grid depends only on sizes). It loads each index-key page
once (``[B, d_idx]``), scores it against all ``q_len x H`` query rows in one dot, takes the max over
the page's tokens, masks pages at or after a row's own page, and keeps a running top-(k-1) per row
by replacing the current worst slot (worst = lowest score, larger id on ties; pages arrive in
ascending id order, so a strict ``>`` keeps the smaller id on ties). Slots go to a workspace
``[T, H, S, KP]`` (score fp32, id int32; empty slots: -inf and a negative id).

Stage 2, grid ``(T, H)``: merges the ``S * KP`` candidates of one row by k-1 rounds of
max extraction (score descending, smaller id on ties), puts the own page last; rows with
``own + 1 <= k`` candidates get ``0..own`` instead. Output int32 ``[T, H, k]``, -1 padded.

Pages at or after the last query's own page are never loaded; no row ever records a page at or
after its own page (the tests check the workspace for that).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from kernels._common.triton_fp8 import _quantize_int8_rows

if TYPE_CHECKING:
    from .launches import IndexerLaunch


@triton.jit
def _indexer_split_kernel(
    q_ptr, key_ptr, scale_ptr, page_table_ptr, seq_lens_ptr, ws_val_ptr, ws_id_ptr,
    stride_qt, stride_qh, stride_kp, stride_kt, stride_sp, stride_pt,
    q_len, num_splits,
    H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, ROWS: tl.constexpr,
    KEEP: tl.constexpr, KP: tl.constexpr, HAS_SCALE: tl.constexpr, DOT_FP32: tl.constexpr,
    PREC: tl.constexpr, PPI: tl.constexpr, FP8_DOT: tl.constexpr, INT8_DOT: tl.constexpr,
):
    r = tl.program_id(0)
    s = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + r)
    rows = tl.arange(0, ROWS)
    qi = rows // H
    hh = rows % H
    row_ok = qi < q_len
    local = (seq_len - q_len + qi) // PAGE  # own page of each row
    local = tl.where(row_ok, local, 0)
    n_hist = (seq_len - 1) // PAGE  # own page of the last query: pages before it are candidates
    per = tl.cdiv(n_hist, num_splits)
    p_lo = s * per
    p_hi = tl.minimum(p_lo + per, n_hist)

    dims = tl.arange(0, D)
    tok = r * q_len + qi
    q = tl.load(
        q_ptr + tok[:, None].to(tl.int64) * stride_qt + hh[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None], other=0.0,
    )
    q_scale = tl.full([ROWS], 1.0, tl.float32)
    if INT8_DOT:  # int8 keys: q rounded to int8 per row (kernels/_common/int8.py), exact int32 dot
        q, q_scale = _quantize_int8_rows(q, DOT_FP32)
    elif DOT_FP32:
        q = q.to(tl.float32)
    elif FP8_DOT:  # e4m3 x e4m3 tensor-core dot: q quantised per row (a positive row factor: same ranking)
        qf = q.to(tl.float32)
        q_scale = tl.maximum(tl.max(tl.abs(qf), axis=1), 1e-30) / 448.0
        q = (qf / q_scale[:, None]).to(tl.float8e4nv)
    elif HAS_SCALE:
        q = q.to(tl.float16)  # e4m3 -> fp16 is one native conversion on sm89+; -> bf16 is not
    slot = tl.arange(0, KP)
    # padding slots (>= KEEP) hold +inf so they are never the worst slot
    vals = tl.full([ROWS, KP], float("-inf"), tl.float32)
    vals = tl.where(slot[None, :] < KEEP, vals, float("inf"))
    ids = (-1 - slot)[None, :] + tl.zeros([ROWS, KP], tl.int32)
    # PPI pages per iteration: one [PPI * PAGE, d_idx] load and one dot, then PPI table updates
    tok_i = tl.arange(0, PPI * PAGE)
    page_of = tok_i // PAGE
    in_page = tok_i % PAGE
    pj = tl.arange(0, PPI)
    for p0 in range(p_lo, p_hi, PPI):
        tok_page = p0 + page_of
        tok_ok = tok_page < p_hi
        phys = tl.load(page_table_ptr + r * stride_pt + tok_page, mask=tok_ok, other=0).to(tl.int64)
        keys = tl.load(key_ptr + phys[:, None] * stride_kp + in_page[:, None] * stride_kt + dims[None, :],
                       mask=tok_ok[:, None], other=0.0)
        if DOT_FP32:
            keys = keys.to(tl.float32)
        elif not (FP8_DOT or INT8_DOT):
            keys = keys.to(q.dtype)
        if INT8_DOT and not DOT_FP32:
            dots = tl.dot(keys, tl.trans(q), out_dtype=tl.int32).to(tl.float32)  # exact
        else:
            dots = tl.dot(keys, tl.trans(q), input_precision=PREC)  # [PPI * PAGE, ROWS] fp32
        if HAS_SCALE:
            tscale = tl.load(scale_ptr + phys * stride_sp + in_page, mask=tok_ok, other=0.0)
            dots = dots * tscale[:, None]
        if PPI == 1:
            page_score = tl.max(dots, axis=0)  # [ROWS]
        else:
            page_score = tl.max(tl.reshape(dots, [PPI, PAGE, ROWS]), axis=1)  # [PPI, ROWS]
        for j in tl.static_range(PPI):
            p = p0 + j
            if PPI == 1:
                score = page_score
            else:
                score = tl.max(tl.where(pj[:, None] == j, page_score, float("-inf")), axis=0)
            score = tl.where(row_ok & (p < local) & (p < p_hi), score, float("-inf"))
            worst = tl.min(vals, axis=1)
            is_worst = vals == worst[:, None]
            victim = tl.max(tl.where(is_worst, ids, -2147483647), axis=1)
            take = is_worst & (ids == victim[:, None]) & (score > worst)[:, None]
            vals = tl.where(take, score[:, None], vals)
            ids = tl.where(take, p, ids)

    vals = tl.where(slot[None, :] < KEEP, vals * q_scale[:, None], float("-inf"))
    ws_off = ((tok[:, None] * H + hh[:, None]) * num_splits + s) * KP + slot[None, :]
    tl.store(ws_val_ptr + ws_off, vals, mask=row_ok[:, None])
    tl.store(ws_id_ptr + ws_off, ids, mask=row_ok[:, None])


@triton.jit
def _indexer_merge_kernel(
    ws_val_ptr, ws_id_ptr, seq_lens_ptr, out_ptr,
    stride_ot, stride_oh, q_len, num_splits,
    H: tl.constexpr, PAGE: tl.constexpr, KP: tl.constexpr, SP: tl.constexpr,
    TOPK: tl.constexpr, TOPK_P: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    r = t // q_len
    i = t % q_len
    seq_len = tl.load(seq_lens_ptr + r)
    local = (seq_len - q_len + i) // PAGE
    cand = tl.arange(0, SP * KP)
    cand_ok = (cand // KP) < num_splits
    base = (t * H + h) * num_splits * KP
    vals = tl.load(ws_val_ptr + base + cand, mask=cand_ok, other=float("-inf"))
    ids = tl.load(ws_id_ptr + base + cand, mask=cand_ok, other=-1)
    jj = tl.arange(0, TOPK_P)
    res = tl.full([TOPK_P], -1, tl.int32)
    for j in range(TOPK - 1):
        best_val = tl.max(vals, axis=0)
        best_id = tl.min(tl.where(vals == best_val, ids, 2147483647), axis=0)
        res = tl.where(jj == j, best_id, res)
        vals = tl.where(ids == best_id, float("-inf"), vals)
    res = tl.where(jj == TOPK - 1, local, res)
    few = tl.where(jj <= local, jj, -1)  # own + 1 <= k candidates: 0..own in order
    res = tl.where(local + 1 <= TOPK, few, res)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + jj, res, mask=jj < TOPK)


def launch_indexer(q_idx, k_idx_cache, k_idx_scale, page_table, seq_lens, q_len, topk, out, ws_val, ws_id,
                   launch: IndexerLaunch):
    """Launch both stages. Shapes: q_idx [T, H, d_idx]; out int32 [T, H, topk];
    ws_val fp32 / ws_id int32 [T, H, splits, keep] with keep = next_pow2(topk - 1)."""
    heads, d_idx = q_idx.shape[1], q_idx.shape[2]
    page = k_idx_cache.shape[1]
    scaled = launch.fp8_keys or launch.int8_keys
    scale = k_idx_scale if scaled else seq_lens  # dummy pointer when unused
    _indexer_split_kernel[(seq_lens.shape[0], launch.splits)](
        q_idx, k_idx_cache, scale, page_table, seq_lens, ws_val, ws_id,
        q_idx.stride(0), q_idx.stride(1), k_idx_cache.stride(0), k_idx_cache.stride(1),
        scale.stride(0) if scaled else 0, page_table.stride(0),
        q_len, launch.splits,
        H=heads, D=d_idx, PAGE=page, ROWS=launch.rows, KEEP=topk - 1, KP=launch.keep,
        HAS_SCALE=scaled, DOT_FP32=launch.dot_fp32, PREC=launch.precision,
        PPI=launch.pages_per_iter, FP8_DOT=launch.fp8_dot, INT8_DOT=launch.int8_keys,
        num_warps=launch.num_warps, num_stages=launch.num_stages,
    )
    _indexer_merge_kernel[(q_idx.shape[0], heads)](
        ws_val, ws_id, seq_lens, out, out.stride(0), out.stride(1), q_len, launch.splits,
        H=heads, PAGE=page, KP=launch.keep, SP=triton.next_power_of_2(launch.splits),
        TOPK=topk, TOPK_P=triton.next_power_of_2(topk),
        num_warps=4,
    )
    return out
