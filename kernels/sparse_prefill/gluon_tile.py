"""Warp-specialised tile kernel for Hopper, written in Gluon (Triton's explicit-layout dialect).

Same math and the same inputs as ``_tile_kernel`` in ``triton_sparse_attention.py`` (its reference is
``naive.py``): per (tile, KV head) item, rows = the tile's ``TQ`` tokens x the group's ``G`` heads
(128), a loop over the tile's union of selected blocks, each row masked to the blocks its token
chose (the token-mask bit as a -inf bias folded into the exponent), the causal mask on steps that
reach past the tile's first position, base-2 online softmax in fp32.

What Triton's automatic pipeline cannot express, and why this kernel exists:

* a **producer warp** (``_producer_tile``) takes the program's items (persistent programs, the next
  item from a global counter so that the items in flight stay neighbours) and issues the TMA copies:
  each item's Q into one of two buffers, each step's K and V into a ring of ``STAGES`` buffers,
  against ``qready`` / ``kready`` / ``vready`` barriers signalled by the copy engine and ``qfree`` /
  ``kfree`` / ``vfree`` barriers signalled by the consumers;
* two **consumer warpgroups** (``_consumer_tile``: the default partition and a 4-warp worker, 64 rows
  each) get the registers the producer does not need (``setmaxnreg``), so the 64 x 128 score and
  output tiles live in registers without a register cap, and
* each step's score MMA ``S = Q K^T`` is issued **before** the previous step's ``P V`` MMA is waited
  on (FlashAttention-3's intra-warpgroup overlap): the softmax of one step runs while the tensor
  cores do the other step's ``P V``.

The **rare kernel** (``_gluon_rare_kernel``, ``launch_gluon_rare``) shares these parts: each item is one
block for up to ``TQ`` tokens that chose it (``rare_items.py``), and the result is merged into the
output already there; its consumers (``_consumer_rare``) pipeline consecutive items like the tile
loop's steps.

Hopper only (sm_90: wgmma, TMA, mbarriers); no CPU interpreter runs Gluon, so its tests are the
GPU-marked ones against the fp32 reference. ``plan.py`` decides when it runs and with what; the
launchers here take the plan and check nothing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

if TYPE_CHECKING:
    from kernels.sparse_prefill.plan import PrefillPlan
    from kernels.sparse_prefill.rare_items import RareItems
    from kernels.sparse_prefill.unions import TileUnions

# the TMA load's name: async_copy_global_to_shared up to Triton 3.6 (the GPU machine's), async_load after
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
_PART0 = gl.constexpr(0)  # the consumer warpgroups' row halves
_PART1 = gl.constexpr(1)
_META = gl.constexpr(8)  # ints per item slot: item, request, first token, q_beg, q_end, kv_len, steps, KV head
_CONSUMER_REGS = gl.constexpr(232)  # registers per thread of the consumer warpgroups / the producer warp (setmaxnreg)
_PRODUCER_REGS = gl.constexpr(40)


@gluon.jit
def _slot_info(item, req, t0, g, steps, CUQ, SEQ):
    """The ``_META`` ints of an item's shared slot: the item and what the consumers would otherwise load
    from global memory one after the other (request, first token, query range, kv length, steps, KV head)."""
    meta_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    idx = gl.arange(0, _META, layout=meta_layout)
    rq = gl.maximum(req, 0)
    return gl.where(idx == 0, item, gl.where(idx == 1, req, gl.where(idx == 2, t0, gl.where(
        idx == 3, gl.load(CUQ + rq), gl.where(idx == 4, gl.load(CUQ + rq + 1), gl.where(
            idx == 5, gl.load(SEQ + rq), gl.where(idx == 6, steps, g)))))))


@gluon.jit
def _hand_over_q(QDESC, q_smem, meta, qready, qfree, info, item, req, g, t0, n, TOKMAP, HKV: gl.constexpr,
                 G: gl.constexpr, TQ: gl.constexpr, GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """Item ``n``'s slot ``info`` into shared slot ``n % NQB`` and barrier ``qready[n % NQB]``, which with
    ``QTMA`` also carries the item's Q (one ``[G, D]`` box per token, rows ``token * HKV * G + g * G`` of Q
    seen as ``[T * Hq, D]``; an empty slot's row is negative: zero-filled) into Q buffer ``n % NQB``, so
    the next item's Q arrives while the consumers finish this one."""
    NQB: gl.constexpr = qready.shape[0]  # item slots and Q buffers
    HALF: gl.constexpr = TQ // 2
    qb = n % NQB
    mbarrier.wait(qfree.index(qb), ((n // NQB) & 1) ^ 1)  # a fresh barrier counts as freed once
    meta.index(qb).store(info)
    gl.thread_barrier()  # the slot written before the barrier's arrive publishes it
    if QTMA:
        if req >= 0:
            mbarrier.expect(qready.index(qb), TQ * QDESC.block_type.nbytes)
            for j in gl.static_range(TQ):
                if GROUPED:
                    tok = gl.load(TOKMAP + item.to(gl.int64) * TQ + j)
                else:
                    tok = t0 + j  # past the request: rows never stored
                _tma_load(QDESC, [(tok * HKV + g) * G, 0], qready.index(qb),
                          q_smem.index(qb * 2 + j // HALF).slice((j % HALF) * G, G))
        else:
            mbarrier.arrive(qready.index(qb))
    else:
        mbarrier.arrive(qready.index(qb))


@gluon.jit
def _load_step(KDESC, VDESC, k_smem, v_smem, kready, vready, kfree, vfree, pages, it, g, c, HKV: gl.constexpr,
               B: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, V_FREE: gl.constexpr):
    """Step ``it`` of an item (step ``c`` across items) into stage ``c % STAGES``: K and V rows
    ``(page * HKV + g) * B + key``, the page read from ``pages``, each once its stage is free (V's only
    with ``V_FREE``: else the caller knows it is)."""
    NSUB: gl.constexpr = B // BN
    s = c % STAGES
    free_phase = ((c // STAGES) & 1) ^ 1
    page = gl.load(pages + it // NSUB)
    row = (page * HKV + g) * B + (it % NSUB) * BN
    mbarrier.wait(kfree.index(s), free_phase)
    mbarrier.expect(kready.index(s), KDESC.block_type.nbytes)
    _tma_load(KDESC, [row, 0], kready.index(s), k_smem.index(s))
    if V_FREE:
        mbarrier.wait(vfree.index(s), free_phase)
    mbarrier.expect(vready.index(s), VDESC.block_type.nbytes)
    _tma_load(VDESC, [row, 0], vready.index(s), v_smem.index(s))


@gluon.jit
def _hand_over(QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree, vfree,
               info, item, req, g, t0, pages, steps, n, c, TOKMAP, HKV: gl.constexpr, G: gl.constexpr,
               TQ: gl.constexpr, B: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
               QTMA: gl.constexpr):
    """Item ``n`` to the consumers (``_hand_over_q``), then every step's K and V (``_load_step``); ``c``
    counts steps across items. Returns ``c`` after the item."""
    _hand_over_q(QDESC, q_smem, meta, qready, qfree, info, item, req, g, t0, n, TOKMAP, HKV, G, TQ, GROUPED, QTMA)
    if req >= 0:
        for it in range(steps):
            _load_step(KDESC, VDESC, k_smem, v_smem, kready, vready, kfree, vfree, pages, it, g, c, HKV, B, BN,
                       STAGES, True)
            c += 1
    return c


@gluon.jit
def _hand_over_end(meta, qready, qfree, n):
    """Item -1 (done) into slot ``n % NQB``."""
    NQB: gl.constexpr = qready.shape[0]
    meta_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    qb = n % NQB
    mbarrier.wait(qfree.index(qb), ((n // NQB) & 1) ^ 1)
    meta.index(qb).store(gl.full([_META], -1, gl.int32, layout=meta_layout))
    gl.thread_barrier()
    mbarrier.arrive(qready.index(qb))


@gluon.jit
def _tile_item(item, CUQ, SEQ, TILE_REQ, TILE_START, UCOUNT, HKV: gl.constexpr, NSUB: gl.constexpr):
    """What a tile producer needs of (tile, KV head) item ``item``: its tile, KV head, request, first token,
    steps (its union's blocks x ``NSUB``) and shared slot ints (``_slot_info``)."""
    tile = item // HKV
    g = item % HKV
    steps = gl.load(UCOUNT + item) * NSUB
    req = gl.load(TILE_REQ + tile)
    t0 = gl.load(TILE_START + tile)
    return tile, g, req, t0, steps, _slot_info(item, req, t0, g, steps, CUQ, SEQ)


@gluon.jit
def _producer_tile(QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree, vfree,
                   CUQ, SEQ, TILE_REQ, TILE_START, TOKMAP, UPAGE, UCOUNT, NEXT, n_items, stride_ut, stride_uh,
                   HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr, B: gl.constexpr, BN: gl.constexpr,
                   STAGES: gl.constexpr, GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """One warp: the program's (tile, KV head) items, ``pid`` first, then the next one of the global
    counter ``NEXT``, each handed over with its union's pages (``_hand_over``)."""
    c = 0
    n = 0
    item = gl.program_id(0)
    while item < n_items:
        tile, g, req, t0, steps, info = _tile_item(item, CUQ, SEQ, TILE_REQ, TILE_START, UCOUNT, HKV, B // BN)
        pages = UPAGE + tile.to(gl.int64) * stride_ut + g * stride_uh
        c = _hand_over(QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree,
                       vfree, info, item, req, g, t0, pages, steps, n, c, TOKMAP, HKV, G, TQ, B, BN, STAGES, GROUPED,
                       QTMA)
        n += 1
        item = gl.atomic_add(NEXT, 1) + gl.num_programs(0)
    _hand_over_end(meta, qready, qfree, n)


@gluon.jit
def _producer_rare(QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree, vfree,
                   CUQ, SEQ, ITEM_TOK, ITEM_G, ITEM_REQ, ITEM_PAGE, NEXT, ROUND, HKV: gl.constexpr,
                   G: gl.constexpr, TQ: gl.constexpr, B: gl.constexpr):
    """One warp: the program's rare items of one round, ``ROUND[0] + pid`` first, then the next one of
    the counter ``NEXT`` until ``ROUND[1]``; each is one whole block (``ITEM_PAGE[item]`` of KV head
    ``ITEM_G[item]``) for the tokens ``ITEM_TOK[item]``, in ``NQB`` = 3 slots and Q buffers
    (``_consumer_rare`` keeps an item's Q buffer until its output is stored through it, while the next
    two items' Q arrive)."""
    c = 0
    n = 0
    first = gl.load(ROUND)
    end = gl.load(ROUND + 1)
    item = first + gl.program_id(0)
    while item < end:
        g = gl.load(ITEM_G + item)
        req = gl.load(ITEM_REQ + item)
        info = _slot_info(item, req, 0, g, 1, CUQ, SEQ)  # (no first token: an item lists its tokens)
        c = _hand_over(QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree,
                       vfree, info, item, req, g, 0, ITEM_PAGE + item, 1, n, c, ITEM_TOK, HKV, G, TQ, B, B, 2, True,
                       True)
        n += 1
        item = first + gl.atomic_add(NEXT, 1) + gl.num_programs(0)
    _hand_over_end(meta, qready, qfree, n)


@gluon.jit
def _step_key(UNION, UMASK, u_off, it, B: gl.constexpr, BN: gl.constexpr):
    """Step ``it`` of a tile's union loop: its first key and the block's token mask."""
    NSUB: gl.constexpr = B // BN
    u = it // NSUB
    key0 = gl.load(UNION + u_off + u) * B + (it % NSUB) * BN
    return key0, gl.load(UMASK + u_off + u)


@gluon.jit
def _softmax_step(s_raw, key0, bits, row_bit, pos, pos_min, offs_n, m_i, l_i, qk_scale, BN: gl.constexpr,
                  p_layout: gl.constexpr, dt: gl.constexpr):
    """Online-softmax update by a step's raw scores (first key ``key0``; the rows whose token's bit is set
    in ``bits`` take part): the new row max and sum, the factor ``alpha`` the accumulator must be
    rescaled by, and ``P`` in the A-operand layout of the P V MMA."""
    bias = gl.where(((bits >> row_bit) & 1) != 0, 0.0, float("-inf"))  # rows whose token chose the block
    if key0 + (BN - 1) > pos_min:  # a key of this step lies past some row: causal mask
        s_raw = gl.where((key0 + offs_n)[None, :] <= pos[:, None], s_raw, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s_raw, axis=1) * qk_scale + bias)
    alpha = gl.exp2(m_i - gl.where(m_new == float("-inf"), 0.0, m_new))  # 0 while m_i = -inf
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s_raw * qk_scale - (m_ref - bias)[:, None])  # non-member rows: reference +inf, p = 0
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return m_new, l_i, alpha, gl.convert_layout(p.to(dt), p_layout)


@gluon.jit
def _row_tokens(rows, TOKMAP, item, t0, q_end, G: gl.constexpr, TQ: gl.constexpr, GROUPED: gl.constexpr):
    """The token of each tile row (row = slot * G + head) and whether the row is real: from the item's
    token map (``GROUPED``, -1: empty slot) or ``t0 + slot`` within the request."""
    if GROUPED:
        tok = gl.load(TOKMAP + item.to(gl.int64) * TQ + rows // G)
        ok = tok >= 0
        tok = gl.maximum(tok, 0)
    else:
        tok = t0 + rows // G
        ok = tok < q_end
    return tok, ok


@gluon.jit
def _slot(meta, qb, i: gl.constexpr):
    """Int ``i`` of shared item slot ``qb`` as a scalar (every thread reads it)."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return gl.max(meta.index(qb).slice(i, 1).load(one), axis=0)


@gluon.jit
def _consumer_tile(Q, ODESC, OUT, LSE, TOKMAP, UNION, UMASK, q_smem, k_smem, v_smem, meta, qready, qfree, kready,
                   vready, kfree, vfree, stride_qt, stride_qh, stride_ot, stride_oh, stride_ut, stride_uh, qk_scale,
                   PART: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr, WM: gl.constexpr,
                   D: gl.constexpr, B: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                   QTMA: gl.constexpr):
    """One warpgroup: rows ``PART * WM ..`` (``WM`` = 64) of each item the producer hands over (shared
    slot and barrier ``n % 2``, item -1: done); ``c`` / ``n``: steps and items so far."""
    c = 0
    n = 0
    mbarrier.wait(qready.index(0), 0)
    item = _slot(meta, 0, 0)
    while item >= 0:
        qb = n % 2
        if _slot(meta, qb, 1) >= 0:
            c = _consumer_item(Q, ODESC, OUT, LSE, TOKMAP, UNION, UMASK, q_smem, k_smem, v_smem, meta, kready,
                               vready, kfree, vfree, item, c, qb, stride_qt, stride_qh, stride_ot, stride_oh,
                               stride_ut, stride_uh, qk_scale, PART, HKV, G, TQ, WM, D, B, BN, STAGES, GROUPED, QTMA)
        mbarrier.arrive(qfree.index(qb))
        n += 1
        mbarrier.wait(qready.index(n % 2), (n // 2) & 1)
        item = _slot(meta, n % 2, 0)


@gluon.jit
def _rare_rows(meta, qb, ITEM_TOK, ITEM_BLK, LSE, PART: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr,
               TQ: gl.constexpr, WM: gl.constexpr, B: gl.constexpr, row_s: gl.constexpr, row_o: gl.constexpr):
    """What a warpgroup needs of rare item slot ``qb``: its KV head, its block's first key, its rows'
    positions (and the lowest), their tokens in the output layout and their earlier LSE."""
    item = _slot(meta, qb, 0)
    g = _slot(meta, qb, 7)
    q_beg = _slot(meta, qb, 3)
    q_end = _slot(meta, qb, 4)
    kv_len = _slot(meta, qb, 5)
    key0 = gl.load(ITEM_BLK + item) * B
    rows = PART * WM + gl.arange(0, WM, layout=row_s)
    tok, row_ok = _row_tokens(rows, ITEM_TOK, item, 0, 0, G, TQ, True)
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    pos_min = gl.min(gl.where(row_ok, pos, 2147483647), axis=0)
    ro = PART * WM + gl.arange(0, WM, layout=row_o)
    to, ok_o = _row_tokens(ro, ITEM_TOK, item, 0, 0, G, TQ, True)
    lse_e = gl.load(LSE + to.to(gl.int64) * (HKV * G) + g * G + ro % G, mask=ok_o, other=float("-inf"))
    return item, g, key0, pos, pos_min, to, ok_o, lse_e


@gluon.jit
def _earlier_out(ODESC, o_tile, ebar, ITEM_TOK, item, g, PART: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr,
                 TQ: gl.constexpr):
    """Copy this warpgroup's rows' output before the merge into ``o_tile`` (its half of the item's Q
    buffer, free once the item's score MMA is done) by TMA, against barrier ``ebar``: it lands while the
    next item runs, before this item's merge reads it (an empty slot's row is negative: zero-filled)."""
    HALF: gl.constexpr = TQ // 2
    mbarrier.expect(ebar, HALF * ODESC.block_type.nbytes)
    for j in gl.static_range(HALF):
        tok = gl.load(ITEM_TOK + item.to(gl.int64) * TQ + PART * HALF + j)
        _tma_load(ODESC, [(tok * HKV + g) * G, 0], ebar, o_tile.slice(j * G, G))


@gluon.jit
def _consumer_rare(ODESC, LSE, ITEM_TOK, ITEM_BLK, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree,
                   vfree, eready, qk_scale, PART: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr,
                   TQ: gl.constexpr, WM: gl.constexpr, D: gl.constexpr, B: gl.constexpr, BN: gl.constexpr):
    """The rare mode's warpgroup. Each item is one whole block (``BN == B``; item ``n``'s K / V in stage
    ``n % 2``, its Q and slot ``n % NQB``), so consecutive items are pipelined like the tile loop's
    steps: item ``n``'s P V and item ``n + 1``'s score MMA are issued together, item ``n``'s merge and
    store run while the score MMA is on the tensor cores, then item ``n + 1``'s softmax (P V is done: the
    registers of P, its A operand, are free). Once an item's score MMA is done its Q buffer takes the
    rows' earlier output (``_earlier_out``, barrier ``eready``), which the merge reads an item later,
    and then the merged output, stored from there; so ``NQB`` = 3 Q buffers keep the next two items'
    Q in flight beside it."""
    gl.static_assert(B == BN, "the rare mode takes whole blocks")
    NQB: gl.constexpr = qready.shape[0]  # item slots and Q buffers (3)
    num_warps: gl.constexpr = 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    row_bit = (PART * WM + gl.arange(0, WM, layout=row_s)) // G
    s_zero = gl.zeros([WM, BN], gl.float32, layout=s_layout)
    o_zero = gl.zeros([WM, D], gl.float32, layout=o_layout)
    m_init = gl.full([WM], float("-inf"), gl.float32, layout=row_s)
    l_init = gl.zeros([WM], gl.float32, layout=row_s)

    n = 0
    mbarrier.wait(qready.index(0), 0)
    if _slot(meta, 0, 0) >= 0:  # (item -1: this program has no item in the round)
        item, g, key0, pos, pos_min, to, ok_o, lse_e = _rare_rows(meta, 0, ITEM_TOK, ITEM_BLK, LSE, PART, HKV, G,
                                                                 TQ, WM, B, row_s, row_o)
        mbarrier.wait(kready.index(0), 0)
        s_tok = warpgroup_mma(q_smem.index(PART), k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s_raw = warpgroup_mma_wait(0, deps=(s_tok, ))
        mbarrier.arrive(kfree.index(0))
        _earlier_out(ODESC, q_smem.index(PART), eready.index(PART), ITEM_TOK, item, g, PART, HKV, G, TQ)
        m_i, l_i, alpha, p_op = _softmax_step(s_raw, key0, -1, row_bit, pos, pos_min, offs_n, m_init, l_init,
                                              qk_scale, BN, p_layout, k_smem.dtype)
        mbarrier.wait(qready.index(1 % NQB), (1 // NQB) & 1)
        item_n = _slot(meta, 1 % NQB, 0)
        while item_n >= 0:
            st = n % 2
            nn = n + 1
            qn = nn % NQB
            _, g_n, key0_n, pos_n, pos_min_n, to_n, ok_n, lse_n = _rare_rows(meta, qn, ITEM_TOK, ITEM_BLK, LSE, PART,
                                                                             HKV, G, TQ, WM, B, row_s, row_o)
            mbarrier.wait(vready.index(st), (n // 2) & 1)
            o_tok = warpgroup_mma(p_op, v_smem.index(st), o_zero, use_acc=False, is_async=True)
            mbarrier.wait(kready.index(nn % 2), (nn // 2) & 1)
            s_tok = warpgroup_mma(q_smem.index(qn * 2 + PART), k_smem.index(nn % 2).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(o_tok, ))  # P V (issued first) is done
            mbarrier.arrive(vfree.index(st))
            _rare_epilogue(acc, m_i, l_i, lse_e, to, ok_o, g, ODESC, LSE, ITEM_TOK, item,
                           q_smem.index((n % NQB) * 2 + PART), eready.index((n % NQB) * 2 + PART), (n // NQB) & 1,
                           PART, HKV, G, TQ, row_o, o_layout)
            mbarrier.arrive(qfree.index(n % NQB))
            s_raw = warpgroup_mma_wait(0, deps=(s_tok, ))
            mbarrier.arrive(kfree.index(nn % 2))
            _earlier_out(ODESC, q_smem.index(qn * 2 + PART), eready.index(qn * 2 + PART), ITEM_TOK, item_n, g_n,
                         PART, HKV, G, TQ)
            m_i, l_i, alpha, p_op = _softmax_step(s_raw, key0_n, -1, row_bit, pos_n, pos_min_n, offs_n, m_init,
                                                  l_init, qk_scale, BN, p_layout, k_smem.dtype)
            n = nn
            item = item_n
            g = g_n
            to = to_n
            ok_o = ok_n
            lse_e = lse_n
            mbarrier.wait(qready.index((n + 1) % NQB), ((n + 1) // NQB) & 1)
            item_n = _slot(meta, (n + 1) % NQB, 0)
        st = n % 2  # the last item: its P V alone
        mbarrier.wait(vready.index(st), (n // 2) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(st), o_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        mbarrier.arrive(vfree.index(st))
        _rare_epilogue(acc, m_i, l_i, lse_e, to, ok_o, g, ODESC, LSE, ITEM_TOK, item,
                       q_smem.index((n % NQB) * 2 + PART), eready.index((n % NQB) * 2 + PART), (n // NQB) & 1,
                       PART, HKV, G, TQ, row_o, o_layout)
        mbarrier.arrive(qfree.index(n % NQB))


@gluon.jit
def _normalised(acc, m_i, l_i, row_o: gl.constexpr):
    """An item's rows normalised by their softmax sums, and their natural-log LSE (-inf for rows with no
    key: their output is 0)."""
    l_o = gl.convert_layout(l_i, row_o)
    nonempty = l_o > 0
    out = acc / gl.where(nonempty, l_o, 1.0)[:, None]
    m_o = gl.convert_layout(m_i, row_o)
    lse = gl.where(nonempty, (m_o + gl.log2(gl.where(nonempty, l_o, 1.0))) * 0.6931471805599453, float("-inf"))
    return out, lse


@gluon.jit
def _store_slots(out, o_tile, ODESC, TOKMAP, item, t0, q_end, g, PART: gl.constexpr, HKV: gl.constexpr,
                 G: gl.constexpr, TQ: gl.constexpr, GROUPED: gl.constexpr):
    """This warpgroup's rows of ``out`` written into ``o_tile`` (its half of an item's Q buffer) and
    stored by TMA, one ``[G, D]`` box per token that exists (``_row_tokens``' rule); the caller waits
    for the stores before the buffer is reused."""
    HALF: gl.constexpr = TQ // 2
    o_tile.store(out.to(o_tile.dtype))
    fence_async_shared()
    gl.thread_barrier()
    for j in gl.static_range(HALF):
        slot = PART * HALF + j
        if GROUPED:
            tok = gl.load(TOKMAP + item.to(gl.int64) * TQ + slot)
            ok = tok >= 0
        else:
            tok = t0 + slot
            ok = tok < q_end
        if ok:
            _tma_store(ODESC, [(tok * HKV + g) * G, 0], o_tile.slice(j * G, G))


@gluon.jit
def _rare_epilogue(acc, m_i, l_i, lse_e, to, ok_o, g, ODESC, LSE, ITEM_TOK, item, o_tile, ebar, phase,
                   PART: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr, row_o: gl.constexpr,
                   o_layout: gl.constexpr):
    """A rare item's rows: normalised, merged with their earlier output (weights ``exp(lse)``; in
    ``o_tile``, this warpgroup's half of the item's Q buffer, once ``ebar`` completes ``phase``) and
    stored by TMA from there, with the merged LSE; returns once the stores have read the buffer."""
    WM: gl.constexpr = acc.shape[0]
    out, lse = _normalised(acc, m_i, l_i, row_o)
    top = gl.maximum(lse_e, lse)
    top = gl.where(top == float("-inf"), 0.0, top)
    w_e = gl.exp(lse_e - top)
    w_n = gl.exp(lse - top)
    tot = w_e + w_n
    tot_safe = gl.where(tot > 0, tot, 1.0)
    mbarrier.wait(ebar, phase)
    earlier = o_tile.load(o_layout).to(gl.float32)
    out = (earlier * (w_e / tot_safe)[:, None]) + out * (w_n / tot_safe)[:, None]
    lse = gl.where(tot > 0, top + gl.log(tot_safe), float("-inf"))
    gl.thread_barrier()  # every row's earlier output read before the buffer takes the result
    _store_slots(out, o_tile, ODESC, ITEM_TOK, item, 0, 0, g, PART, HKV, G, TQ, True)
    ro = PART * WM + gl.arange(0, WM, layout=row_o)
    gl.store(LSE + to.to(gl.int64) * (HKV * G) + g * G + ro % G, lse, mask=ok_o)
    tma.store_wait(0)


@gluon.jit
def _consumer_item(Q, ODESC, OUT, LSE, TOKMAP, UNION, UMASK, q_smem, k_smem, v_smem, meta, kready, vready,
                   kfree, vfree, item, c, qb, stride_qt, stride_qh, stride_ot, stride_oh,
                   stride_ut, stride_uh, qk_scale, PART: gl.constexpr, HKV: gl.constexpr, G: gl.constexpr,
                   TQ: gl.constexpr, WM: gl.constexpr, D: gl.constexpr, B: gl.constexpr, BN: gl.constexpr,
                   STAGES: gl.constexpr, GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """One item's rows: Q, the union loop, the store; ``c`` (steps of the earlier items) places the
    item's steps in the ring, ``qb`` is its Q buffer (``QTMA``: filled, the caller waited; out is then
    stored by TMA through it); returns ``c`` after it.

    Step 0's scores and softmax come first; then each step issues its score MMA and the previous
    step's P V MMA together and runs its softmax while P V is still on the tensor cores."""
    BLOCK_M: gl.constexpr = WM
    num_warps: gl.constexpr = 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])

    tile = item // HKV
    g = _slot(meta, qb, 7)
    t0 = _slot(meta, qb, 2)
    q_beg = _slot(meta, qb, 3)
    q_end = _slot(meta, qb, 4)
    kv_len = _slot(meta, qb, 5)
    n_steps = _slot(meta, qb, 6)
    u_off = tile.to(gl.int64) * stride_ut + g * stride_uh

    if QTMA:  # Q in one of the two buffers the producer fills
        q_tile = q_smem.index(qb * 2 + PART)
    else:  # Q gathered by this warpgroup into its shared memory
        rq = PART * WM + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
        tq, okq = _row_tokens(rq, TOKMAP, item, t0, q_end, G, TQ, GROUPED)
        dq = gl.arange(0, D, layout=gl.SliceLayout(0, q_layout))
        q = gl.load(Q + tq.to(gl.int64)[:, None] * stride_qt + (g * G + rq % G)[:, None] * stride_qh + dq[None, :],
                    mask=okq[:, None], other=0.0)
        q_tile = q_smem.index(PART)
        q_tile.store(q)
        fence_async_shared()
        gl.thread_barrier()

    # the rows' tokens and positions in the score layout
    rows = PART * WM + gl.arange(0, BLOCK_M, layout=row_s)
    tok, row_ok = _row_tokens(rows, TOKMAP, item, t0, q_end, G, TQ, GROUPED)
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    pos_min = gl.min(gl.where(row_ok, pos, 2147483647), axis=0)
    row_bit = rows // G
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BN], gl.float32, layout=s_layout)
    if n_steps > 0:
        s0 = c % STAGES
        mbarrier.wait(kready.index(s0), (c // STAGES) & 1)
        s_tok = warpgroup_mma(q_tile, k_smem.index(s0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_raw = warpgroup_mma_wait(0, deps=(s_tok, ))
        mbarrier.arrive(kfree.index(s0))
        key0, bits = _step_key(UNION, UMASK, u_off, 0, B, BN)
        m_i, l_i, alpha, p_op = _softmax_step(s_raw, key0, bits, row_bit, pos, pos_min, offs_n, m_i, l_i, qk_scale,
                                              BN, p_layout, k_smem.dtype)
        for it in range(1, n_steps):
            st = (c + it) % STAGES
            prev = (c + it - 1) % STAGES
            mbarrier.wait(kready.index(st), ((c + it) // STAGES) & 1)
            mbarrier.wait(vready.index(prev), ((c + it - 1) // STAGES) & 1)
            s_tok = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s_raw = warpgroup_mma_wait(1, deps=(s_tok, ))  # the score MMA (issued first) is done
            mbarrier.arrive(kfree.index(st))
            key0, bits = _step_key(UNION, UMASK, u_off, it, B, BN)
            m_i, l_i, alpha, p_op = _softmax_step(s_raw, key0, bits, row_bit, pos, pos_min, offs_n, m_i, l_i,
                                                  qk_scale, BN, p_layout, k_smem.dtype)
            acc = warpgroup_mma_wait(0, deps=(o_tok, ))
            mbarrier.arrive(vfree.index(prev))
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        last = (c + n_steps - 1) % STAGES
        mbarrier.wait(vready.index(last), ((c + n_steps - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        mbarrier.arrive(vfree.index(last))

    # epilogue: normalise, store out and the natural-log LSE
    out, lse = _normalised(acc, m_i, l_i, row_o)
    ro = PART * WM + gl.arange(0, BLOCK_M, layout=row_o)
    to, ok_o = _row_tokens(ro, TOKMAP, item, t0, q_end, G, TQ, GROUPED)
    head = g * G + ro % G
    lse_ptr = LSE + to.to(gl.int64) * (HKV * G) + head
    if QTMA:  # through this warpgroup's half of the item's Q buffer (its last read was the last score MMA)
        _store_slots(out, q_smem.index(qb * 2 + PART), ODESC, TOKMAP, item, t0, q_end, g, PART, HKV, G, TQ, GROUPED)
        tma.store_wait(0)  # the buffer is read before the caller frees it
    else:
        do = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        gl.store(OUT + to.to(gl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + do[None, :],
                 out.to(OUT.dtype.element_ty), mask=ok_o[:, None])
    gl.store(lse_ptr, lse, mask=ok_o)
    return c + n_steps


@gluon.jit
def _shared(KDESC, VDESC, NQB: gl.constexpr, NQ: gl.constexpr, WM: gl.constexpr, D: gl.constexpr,
            BN: gl.constexpr, STAGES: gl.constexpr):
    """A program's shared memory and barriers, initialised: ``NQ`` Q halves of ``[WM, D]``, the K / V
    ring of ``STAGES``, ``NQB`` item slots of ``_META`` ints; ready barriers take one arrive (or the
    copy engine's bytes), free ones one arrive per consumer warpgroup."""
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WM, D], KDESC.dtype)
    q_smem = gl.allocate_shared_memory(KDESC.dtype, [NQ, WM, D], q_layout)
    k_smem = gl.allocate_shared_memory(KDESC.dtype, [STAGES, BN, D], KDESC.layout)
    v_smem = gl.allocate_shared_memory(VDESC.dtype, [STAGES, BN, D], VDESC.layout)
    kready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kfree = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vfree = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qready = gl.allocate_shared_memory(gl.int64, [NQB, 1], mbarrier.MBarrierLayout())
    qfree = gl.allocate_shared_memory(gl.int64, [NQB, 1], mbarrier.MBarrierLayout())
    meta = gl.allocate_shared_memory(gl.int32, [NQB, _META], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    for i in gl.static_range(STAGES):
        mbarrier.init(kready.index(i), count=1)
        mbarrier.init(vready.index(i), count=1)
        mbarrier.init(kfree.index(i), count=2)
        mbarrier.init(vfree.index(i), count=2)
    for i in gl.static_range(NQB):
        mbarrier.init(qready.index(i), count=1)
        mbarrier.init(qfree.index(i), count=2)
    return q_smem, k_smem, v_smem, kready, vready, kfree, vfree, qready, qfree, meta


@gluon.jit
def _gluon_tile_kernel(Q, QDESC, KDESC, VDESC, ODESC, OUT, LSE, CUQ, SEQ, TILE_REQ, TILE_START, TOKMAP, UNION, UPAGE,
                       UMASK, UCOUNT, NEXT, n_items, stride_qt, stride_qh, stride_ot, stride_oh, stride_ut,
                       stride_uh, qk_scale, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr, D: gl.constexpr,
                       B: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr,
                       QTMA: gl.constexpr):
    """Launched with 4 warps, persistent: the default partition is consumer 0; the workers consumer 1
    (4 warps) and the producer (1 warp), which takes the (tile, KV head) items (``_producer_tile``).
    ``NEXT``: the item counter, zero at launch; ``QTMA``: Q copied by the producer and out stored by
    TMA through ``ODESC`` (else both by the consumers)."""
    WM: gl.constexpr = TQ * G // 2
    NQ: gl.constexpr = 4 if QTMA else 2  # (Q buffers x) warpgroups
    q_smem, k_smem, v_smem, kready, vready, kfree, vfree, qready, qfree, meta = _shared(KDESC, VDESC, 2, NQ, WM, D,
                                                                                        BN, STAGES)
    gl.warp_specialize([
        (_consumer_tile, (Q, ODESC, OUT, LSE, TOKMAP, UNION, UMASK, q_smem, k_smem, v_smem, meta, qready, qfree,
                          kready, vready, kfree, vfree, stride_qt, stride_qh, stride_ot, stride_oh, stride_ut,
                          stride_uh, qk_scale, _PART0, HKV, G, TQ, WM, D, B, BN, STAGES, GROUPED, QTMA)),
        (_consumer_tile, (Q, ODESC, OUT, LSE, TOKMAP, UNION, UMASK, q_smem, k_smem, v_smem, meta, qready, qfree,
                          kready, vready, kfree, vfree, stride_qt, stride_qh, stride_ot, stride_oh, stride_ut,
                          stride_uh, qk_scale, _PART1, HKV, G, TQ, WM, D, B, BN, STAGES, GROUPED, QTMA)),
        (_producer_tile, (QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree,
                          vfree, CUQ, SEQ, TILE_REQ, TILE_START, TOKMAP, UPAGE, UCOUNT, NEXT, n_items, stride_ut,
                          stride_uh, HKV, G, TQ, B, BN, STAGES, GROUPED, QTMA)),
    ], [4, 1], [_CONSUMER_REGS, _PRODUCER_REGS])


@gluon.jit
def _gluon_rare_kernel(QDESC, KDESC, VDESC, ODESC, LSE, CUQ, SEQ, ITEM_TOK, ITEM_G, ITEM_REQ, ITEM_BLK, ITEM_PAGE,
                       NEXT, ROUND, qk_scale, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr, D: gl.constexpr,
                       B: gl.constexpr):
    """One round of rare items (``rare_items.RareItems``: tokens, KV head, request, logical block and
    page per item; ``ROUND``: the round's first and end item), launched with 4 warps, persistent: the
    consumers ``_consumer_rare``, the producer ``_producer_rare``. Q and the earlier output come by TMA
    and the merged output leaves by TMA (``QDESC`` / ``ODESC``); whole blocks in 2 stages, three Q
    buffers. ``NEXT``: the round's item counter, zero at launch."""
    WM: gl.constexpr = TQ * G // 2
    q_smem, k_smem, v_smem, kready, vready, kfree, vfree, qready, qfree, meta = _shared(KDESC, VDESC, 3, 6, WM, D,
                                                                                        B, 2)
    eready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())  # earlier output per Q half
    for i in gl.static_range(6):
        mbarrier.init(eready.index(i), count=1)
    gl.warp_specialize([
        (_consumer_rare, (ODESC, LSE, ITEM_TOK, ITEM_BLK, q_smem, k_smem, v_smem, meta, qready, qfree, kready,
                          vready, kfree, vfree, eready, qk_scale, _PART0, HKV, G, TQ, WM, D, B, B)),
        (_consumer_rare, (ODESC, LSE, ITEM_TOK, ITEM_BLK, q_smem, k_smem, v_smem, meta, qready, qfree, kready,
                          vready, kfree, vfree, eready, qk_scale, _PART1, HKV, G, TQ, WM, D, B, B)),
        (_producer_rare, (QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree,
                          vfree, CUQ, SEQ, ITEM_TOK, ITEM_G, ITEM_REQ, ITEM_PAGE, NEXT, ROUND, HKV, G, TQ, B)),
    ], [4, 1], [_CONSUMER_REGS, _PRODUCER_REGS])


def _descriptors(q, k_cache, v_cache, out, group: int, block_n: int, q_tma: bool):
    """The K / V tensor descriptors (``block_n x d`` boxes over the caches seen as ``[pages * Hkv * B, d]``)
    and, with ``q_tma``, the Q and out ones (``[G, d]`` boxes over ``[T * Hq, d]``; else K's, unused)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = q.shape[-1]
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([block_n, d], dtype)
    kdesc = TensorDescriptor.from_tensor(k_cache.view(-1, d), [block_n, d], layout)
    vdesc = TensorDescriptor.from_tensor(v_cache.view(-1, d), [block_n, d], layout)
    if not q_tma:
        return kdesc, kdesc, vdesc, kdesc
    box = gl.NVMMASharedLayout.get_default_for([group, d], dtype)
    return (TensorDescriptor.from_tensor(q.view(-1, d), [group, d], box), kdesc, vdesc,
            TensorDescriptor.from_tensor(out.view(-1, d), [group, d], box))


def launch_gluon_tile(plan: PrefillPlan, q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv,
                      tiles: tuple[torch.Tensor, torch.Tensor], union: TileUnions, qk_scale: float) -> None:
    """The (tile, KV head) items over ``union`` (``unions.py``), writing ``out`` / ``lse`` of the union
    blocks; ``qk_scale`` includes log2(e); ``plan.programs`` persistent programs. bf16 / fp16 caches (e4m3:
    ``gluon_tile_fp8.launch_gluon_tile_fp8``; ``launch.gluon_launchers`` picks)."""
    tile_req, tile_start = tiles
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // hkv
    qdesc, kdesc, vdesc, odesc = _descriptors(q, k_cache, v_cache, out, group, plan.block_n, plan.q_tma)
    tokmap = union.tokmap if union.tokmap is not None else union.count
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    _gluon_tile_kernel[(plan.programs,)](
        q, qdesc, kdesc, vdesc, odesc, out, lse, cu_seqlens_q, seq_lens_kv, tile_req, tile_start, tokmap, union.union,
        union.pages, union.token_mask, union.count, counter, tile_req.shape[0] * hkv, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), union.union.stride(0), union.union.stride(1), qk_scale, HKV=hkv, G=group,
        TQ=plan.tile_q, D=q.shape[-1], B=block, BN=plan.block_n, STAGES=plan.num_stages,
        GROUPED=union.tokmap is not None, QTMA=plan.q_tma, num_warps=4)


def launch_gluon_rare(plan: PrefillPlan, q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv, items: RareItems,
                      qk_scale: float) -> None:
    """Merge the rare pairs bucketed in ``items`` into ``out`` / ``lse``: one persistent launch of
    ``plan.rare_programs`` programs per round (a token is in at most one item of a round, so no two
    programs merge into the same rows at once); each item is one block for up to ``tile_q`` tokens,
    its K / V read once for all of them. bf16 / fp16 caches (e4m3: ``gluon_tile_fp8.launch_gluon_rare_fp8``)."""
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // hkv
    qdesc, kdesc, vdesc, odesc = _descriptors(q, k_cache, v_cache, out, group, block, True)
    rounds = items.round_start.shape[0] - 1
    counters = torch.zeros(rounds, dtype=torch.int32, device=q.device)
    for r in range(rounds):
        _gluon_rare_kernel[(plan.rare_programs,)](
            qdesc, kdesc, vdesc, odesc, lse, cu_seqlens_q, seq_lens_kv, items.tok, items.g, items.req, items.blk,
            items.page, counters[r:], items.round_start[r:], qk_scale, HKV=hkv, G=group, TQ=plan.tile_q,
            D=q.shape[-1], B=block, num_warps=4)
