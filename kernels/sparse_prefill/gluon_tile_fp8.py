"""Q8KV8 (FP8 e4m3 K/V, Q quantised in the kernel) in the warp-specialised Gluon tile and rare kernels.

A sibling of ``gluon_tile.py`` (the bf16 kernels there stay as they were): the same TMA copies of K / V
rows ``(page * Hkv + g) * B + key`` of the caches seen as ``[rows, d]`` (now e4m3) and the same item and
row bookkeeping; the consumers differ in four places, each FP8's rule (``kernels/_common/fp8.py``:
value = x8 * scale):

* **Q** arrives in the model dtype (by TMA into the bf16 Q buffer, or gathered by the consumer) and
  each warpgroup quantises its 64 rows in registers, per (token, head) row by the shared rule
  (``scale = max(amax, 1e-12) / 448``, round to nearest even), into its own e4m3 buffer ``q8``: no
  pre-pass and no extra global traffic; the bf16 Q buffer keeps its second job (staging the output
  for the TMA store, the rare merge's earlier output).
* **QK** is an e4m3 wgmma (fp32 accumulate); the scores are multiplied by ``q_scale[row] *
  qk_scale`` and ``k_scale[key]`` (plain loads of the key rows' scales, masked past ``kv_len``)
  before the unchanged base-2 online softmax with the running max.
* **PV** is an e4m3 wgmma: ``P`` (in [0, 1] after the max shift) times ``v_scale[key] * 256 / vmax``
  (``vmax``: the step's largest value scale; 256 as ``naive.P_RANGE``) is cast to e4m3; the
  accumulator is kept in units of the current step's ``vmax / 256`` (the ratio of two steps' units
  folds into the softmax rescale ``alpha``) and multiplied by the last unit before the normalisation:
  no second accumulator.
* Hopper's e4m3 wgmma wants both shared operands K-major; V ``[keys, d]`` is MN-major for P V, so V is
  transposed through registers into ``[d, keys]`` buffers ``vt`` (``_transpose_v``). In the tile kernel
  the producer is a whole warpgroup that does it once per step into a ring the two consumers share
  (``_producer_tile_fp8``); the rare kernel's consumers transpose their item's V themselves. The
  transposed keys take the order in which the score MMA's accumulator already holds P as the P V
  MMA's 8-bit A operand (``_key_order``), so P reaches that MMA without an exchange between threads.

Measured at M3 128K on an H200 (``benchmarks/kernels/RESULTS.md``): moving the transpose to the producer
and the key order took the Q8KV8 attention from 49.3 to 32 ms (bf16: 21 ms). Staging the key / value
scales in shared memory by TMA (the consumers reading them in the score layout, no exchange) measured
slower (41.7 ms) and is not kept.

References: the exact dequantising torch attention (``tests/kernels/test_gluon_fp8_gpu.py``); Hopper
only, no interpreter runs Gluon.
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

from kernels._common.validate import check_kv_scales
from kernels.sparse_prefill.gluon_tile import (
    _CONSUMER_REGS,
    _META,
    _PART0,
    _PART1,
    _PRODUCER_REGS,
    _earlier_out,
    _hand_over_end,
    _hand_over_q,
    _load_step,
    _normalised,
    _producer_rare,
    _rare_epilogue,
    _rare_rows,
    _row_tokens,
    _slot,
    _step_key,
    _store_slots,
    _tile_item,
)

if TYPE_CHECKING:
    from kernels.sparse_prefill.plan import PrefillPlan
    from kernels.sparse_prefill.rare_items import RareItems
    from kernels.sparse_prefill.unions import TileUnions

_E4M3_MAX = gl.constexpr(448.0)  # kernels/_common/fp8.py's E4M3_MAX
_P_RANGE = gl.constexpr(256.0)  # e4m3 P lies in [0, 256] (naive.P_RANGE: a power of two below 448, so the
# small probabilities stay normal numbers longer)
_SMEM_BYTES = 227 * 1024  # the H200's shared memory per block


@gluon.jit
def _quantise_rows(q, q8_tile):
    """fp32 rows ``q`` ``[M, D]`` -> e4m3 into shared ``q8_tile`` by the FP8 rule; returns the rows'
    scales (in ``SliceLayout(1, q.layout)``). The caller's MMAs that read ``q8_tile`` are done."""
    scale = gl.maximum(gl.max(gl.abs(q), axis=1), 1e-12) / _E4M3_MAX
    q8 = gl.minimum(gl.maximum(q / scale[:, None], -_E4M3_MAX), _E4M3_MAX).to(gl.float8e4nv)
    q8_tile.store(q8)
    fence_async_shared()
    gl.thread_barrier()  # every warp's rows stored before the MMA reads the tile
    return scale


@gluon.constexpr_function
def _vt_layout(rows, d, warps):
    """The register layout in which ``rows`` keys x ``d`` of V are read for the transpose (a linear layout:
    bit lists): registers d0 d1 (4 consecutive values: 32-bit shared loads) and key bits 0, 1, 3 (after
    ``_key_order`` these are 8 consecutive keys of V^T: 64-bit shared stores), then lanes and warps the
    rest (zero bases past the tile: replicated)."""
    rest = [[0, 1 << i] for i in range(2, (d - 1).bit_length())]
    rest += [[1 << i, 0] for i in (2, 4, 5, 6, 7) if (1 << i) < rows] + [[0, 0]] * 8
    nw = (warps - 1).bit_length()
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [8, 0]], lane_bases=rest[:5],
                                      warp_bases=rest[5:5 + nw], block_bases=[], shape=[rows, d])


@gluon.jit
def _key_order(x, AXIS: gl.constexpr):
    """The keys of ``x`` (axis ``AXIS`` of 2, a multiple of 32) in the order of Hopper's 8-bit A operand:
    within each 32 keys, key ``16h + 8b + 2t + e`` (``t`` < 4) moves to ``16h + 4t + 2b + e``. That is the
    order in which a thread of the P V MMA holds P in the score MMA's accumulator layout, so P in this
    order needs no data movement to become the A operand (``gl.convert_layout`` is free), and the sum over
    keys is unchanged when V's keys take the same order (``_transpose_v``): FlashAttention-3's FP8 trick."""
    if AXIS == 0:
        N: gl.constexpr = x.shape[0]
        C: gl.constexpr = x.shape[1]
        y = gl.reshape(gl.permute(gl.reshape(x, [N // 32, 2, 2, 4, 2, C]), (0, 1, 3, 2, 4, 5)), [N, C])
    else:
        M: gl.constexpr = x.shape[0]
        N: gl.constexpr = x.shape[1]
        y = gl.reshape(gl.permute(gl.reshape(x, [M, N // 32, 2, 2, 4, 2]), (0, 1, 2, 4, 3, 5)), [M, N])
    return y


@gluon.jit
def _transpose_v(v_tile, vt_tile, D: gl.constexpr):
    """The step's V ``[BN, D]`` (MN-major for P V) into ``vt_tile`` ``[D, BN]`` (K-major), keys in
    ``_key_order``, through registers in sub-tiles of 4096 values (32 bytes per thread for 4 warps); the
    P V MMA that read ``vt_tile`` before is done."""
    BN: gl.constexpr = v_tile.shape[0]
    SUB: gl.constexpr = min(BN, 4096 // D)
    layout: gl.constexpr = _vt_layout(SUB, D, gl.num_warps())
    for j in gl.static_range(BN // SUB):
        v = _key_order(v_tile.slice(j * SUB, SUB).load(layout), 0)
        vt_tile.slice(j * SUB, SUB, dim=1).store(gl.permute(v, (1, 0)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _stage_vt(v_smem, vt_smem, vready, vtready, vtfree, c, D: gl.constexpr, STAGES: gl.constexpr):
    """Step ``c``'s V (stage ``c % STAGES``, once landed) transposed into ``vt`` stage ``c % STAGES`` (once
    both consumers' P V MMAs of step ``c - STAGES`` are done), then ``vtready``."""
    s = c % STAGES
    phase = (c // STAGES) & 1
    mbarrier.wait(vready.index(s), phase)
    mbarrier.wait(vtfree.index(s), phase ^ 1)
    _transpose_v(v_smem.index(s), vt_smem.index(s), D)
    mbarrier.arrive(vtready.index(s))


@gluon.jit
def _producer_tile_fp8(QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, vt_smem, meta, qready, qfree, kready, vready,
                       kfree, vfree, vtready, vtfree, CUQ, SEQ, TILE_REQ, TILE_START, TOKMAP, UPAGE, UCOUNT, NEXT,
                       n_items, stride_ut, stride_uh, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr,
                       D: gl.constexpr, B: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """``gluon_tile._producer_tile`` in one warpgroup that also transposes V: each step's K / V copies
    are issued (``_load_step``; V's stage is free once this warpgroup has transposed it, so no ``vfree``),
    then the previous step's V is transposed into the ``vt`` ring the consumers' P V MMAs read
    (``_stage_vt``), once per step instead of once per consumer warpgroup and off their path; an item's
    last V is transposed before the next item is handed over (a consumer waiting for it may hold the
    slot the hand-over waits for)."""
    c = 0
    n = 0
    item = gl.program_id(0)
    while item < n_items:
        tile, g, req, t0, steps, info = _tile_item(item, CUQ, SEQ, TILE_REQ, TILE_START, UCOUNT, HKV, B // BN)
        _hand_over_q(QDESC, q_smem, meta, qready, qfree, info, item, req, g, t0, n, TOKMAP, HKV, G, TQ, GROUPED, QTMA)
        if req >= 0:
            pages = UPAGE + tile.to(gl.int64) * stride_ut + g * stride_uh
            for it in range(steps):
                _load_step(KDESC, VDESC, k_smem, v_smem, kready, vready, kfree, vfree, pages, it, g, c, HKV, B, BN,
                           STAGES, False)
                if it > 0:
                    _stage_vt(v_smem, vt_smem, vready, vtready, vtfree, c - 1, D, STAGES)
                c += 1
            if steps > 0:
                _stage_vt(v_smem, vt_smem, vready, vtready, vtfree, c - 1, D, STAGES)
        n += 1
        item = gl.atomic_add(NEXT, 1) + gl.num_programs(0)
    _hand_over_end(meta, qready, qfree, n)


@gluon.jit
def _key_scales(KS, VS, page, g, key0, sub0, kv_len, HKV: gl.constexpr, B: gl.constexpr, BN: gl.constexpr):
    """The step's key and value scales ``[BN]`` (rows ``(page * HKV + g) * B + sub0 + n``; keys at or past
    ``kv_len``: 0, so a half-filled block's unwritten slots play no part in ``vmax``), in a compact layout
    (about one per thread: the score layout would hold 2 x BN / 8 of each per thread across the MMAs)."""
    compact: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    n = gl.arange(0, BN, layout=compact)
    off = (page.to(gl.int64) * HKV + g) * B + sub0 + n
    ok = key0 + n < kv_len
    return gl.load(KS + off, mask=ok, other=0.0), gl.load(VS + off, mask=ok, other=0.0)


@gluon.jit
def _softmax_step_fp8(s_raw, q_sc, k_sc, v_sc, key0, bits, row_bit, pos, pos_min, offs_n, m_i, l_i,
                      BN: gl.constexpr, p_layout: gl.constexpr):
    """``gluon_tile._softmax_step`` on e4m3 scores: ``s_raw * q_sc[row] * k_sc[key]`` (``q_sc`` holds
    ``qk_scale``); also returns ``P * v_sc * 256 / vmax`` in e4m3 (``vmax``: the step's largest value
    scale), the A operand of the P V MMA with its keys in ``_key_order``, and the unit ``vmax / 256`` of
    its product (the sum ``l_i`` takes ``P`` itself)."""
    col: gl.constexpr = offs_n.type.layout
    x = s_raw * gl.convert_layout(k_sc, col)[None, :]  # q_sc (> 0) joins in the max and the exponent's FMA
    bias = gl.where(((bits >> row_bit) & 1) != 0, 0.0, float("-inf"))  # rows whose token chose the block
    if key0 + (BN - 1) > pos_min:  # a key of this step lies past some row (or past kv_len): causal mask
        x = gl.where((key0 + offs_n)[None, :] <= pos[:, None], x, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(x, axis=1) * q_sc + bias)
    alpha = gl.exp2(m_i - gl.where(m_new == float("-inf"), 0.0, m_new))  # 0 while m_i = -inf
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(x * q_sc[:, None] - (m_ref - bias)[:, None])  # non-member rows: reference +inf, p = 0
    l_i = l_i * alpha + gl.sum(p, axis=1)
    v_col = gl.convert_layout(v_sc, col)
    vmax = gl.max(v_col, axis=0)  # (in the columns' layout: a reduction within each quad of lanes)
    vmax = gl.where(vmax > 0, vmax, 1.0)  # (a step wholly past kv_len: every p is 0)
    p8 = (p * (v_col * (_P_RANGE / vmax))[None, :]).to(gl.float8e4nv)
    return m_new, l_i, alpha, gl.convert_layout(_key_order(p8, 1), p_layout), vmax / _P_RANGE


@gluon.jit
def _consumer_tile_fp8(Q, ODESC, OUT, LSE, TOKMAP, UNION, UPAGE, UMASK, KS, VS, q_smem, q8_smem, vt_smem, k_smem,
                       meta, qready, qfree, kready, vtready, kfree, vtfree, stride_qt, stride_qh, stride_ot,
                       stride_oh, stride_ut, stride_uh, qk_scale, PART: gl.constexpr, HKV: gl.constexpr,
                       G: gl.constexpr, TQ: gl.constexpr, WM: gl.constexpr, D: gl.constexpr, B: gl.constexpr,
                       BN: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """``gluon_tile._consumer_tile`` with ``_consumer_item_fp8``."""
    c = 0
    n = 0
    mbarrier.wait(qready.index(0), 0)
    item = _slot(meta, 0, 0)
    while item >= 0:
        qb = n % 2
        if _slot(meta, qb, 1) >= 0:
            c = _consumer_item_fp8(Q, ODESC, OUT, LSE, TOKMAP, UNION, UPAGE, UMASK, KS, VS, q_smem, q8_smem, vt_smem,
                                   k_smem, meta, kready, vtready, kfree, vtfree, item, c, qb, stride_qt,
                                   stride_qh, stride_ot, stride_oh, stride_ut, stride_uh, qk_scale, PART, HKV, G, TQ,
                                   WM, D, B, BN, STAGES, GROUPED, QTMA)
        mbarrier.arrive(qfree.index(qb))
        n += 1
        mbarrier.wait(qready.index(n % 2), (n // 2) & 1)
        item = _slot(meta, n % 2, 0)


@gluon.jit
def _consumer_item_fp8(Q, ODESC, OUT, LSE, TOKMAP, UNION, UPAGE, UMASK, KS, VS, q_smem, q8_smem, vt_smem, k_smem,
                       meta, kready, vtready, kfree, vtfree, item, c, qb, stride_qt, stride_qh, stride_ot,
                       stride_oh, stride_ut, stride_uh, qk_scale, PART: gl.constexpr, HKV: gl.constexpr,
                       G: gl.constexpr, TQ: gl.constexpr, WM: gl.constexpr, D: gl.constexpr, B: gl.constexpr,
                       BN: gl.constexpr, STAGES: gl.constexpr, GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """``gluon_tile._consumer_item`` in Q8KV8 (the module docstring): the same step order (step ``it``'s
    score MMA and step ``it - 1``'s P V MMA in flight together), that MMA reading step ``it - 1``'s V^T
    from the producer's ``vt`` ring, the accumulator in units of the last step's ``vmax / 256``."""
    NSUB: gl.constexpr = B // BN
    num_warps: gl.constexpr = 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
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
    q8_tile = q8_smem.index(PART)

    if QTMA:  # Q in one of the two buffers the producer fills (the caller waited)
        q = q_smem.index(qb * 2 + PART).load(q_layout).to(gl.float32)
    else:  # Q gathered by this warpgroup
        rq = PART * WM + gl.arange(0, WM, layout=gl.SliceLayout(1, q_layout))
        tq, okq = _row_tokens(rq, TOKMAP, item, t0, q_end, G, TQ, GROUPED)
        dq = gl.arange(0, D, layout=gl.SliceLayout(0, q_layout))
        q = gl.load(Q + tq.to(gl.int64)[:, None] * stride_qt + (g * G + rq % G)[:, None] * stride_qh + dq[None, :],
                    mask=okq[:, None], other=0.0).to(gl.float32)
    q_sc = gl.convert_layout(_quantise_rows(q, q8_tile), row_s) * qk_scale

    rows = PART * WM + gl.arange(0, WM, layout=row_s)
    tok, row_ok = _row_tokens(rows, TOKMAP, item, t0, q_end, G, TQ, GROUPED)
    pos = kv_len - (q_end - q_beg) + (tok - q_beg)
    pos_min = gl.min(gl.where(row_ok, pos, 2147483647), axis=0)
    row_bit = rows // G
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))

    m_i = gl.full([WM], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.zeros([WM], gl.float32, layout=row_s)
    acc = gl.zeros([WM, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([WM, BN], gl.float32, layout=s_layout)
    vmax = gl.to_tensor(1.0)  # (no step: acc stays 0)
    if n_steps > 0:
        s0 = c % STAGES
        mbarrier.wait(kready.index(s0), (c // STAGES) & 1)
        s_tok = warpgroup_mma(q8_tile, k_smem.index(s0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        key0, bits = _step_key(UNION, UMASK, u_off, 0, B, BN)
        k_sc, v_sc = _key_scales(KS, VS, gl.load(UPAGE + u_off), g, key0, 0, kv_len, HKV, B, BN)
        s_raw = warpgroup_mma_wait(0, deps=(s_tok, ))
        mbarrier.arrive(kfree.index(s0))
        m_i, l_i, alpha, p_op, vmax = _softmax_step_fp8(s_raw, q_sc, k_sc, v_sc, key0, bits, row_bit, pos, pos_min,
                                                        offs_n, m_i, l_i, BN, p_layout)
        for it in range(1, n_steps):
            st = (c + it) % STAGES
            prev = (c + it - 1) % STAGES
            key0, bits = _step_key(UNION, UMASK, u_off, it, B, BN)
            k_sc, v_sc = _key_scales(KS, VS, gl.load(UPAGE + u_off + it // NSUB), g, key0, (it % NSUB) * BN, kv_len,
                                     HKV, B, BN)
            mbarrier.wait(vtready.index(prev), ((c + it - 1) // STAGES) & 1)
            mbarrier.wait(kready.index(st), ((c + it) // STAGES) & 1)
            s_tok = warpgroup_mma(q8_tile, k_smem.index(st).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            o_tok = warpgroup_mma(p_op, vt_smem.index(prev).permute((1, 0)), acc, is_async=True)
            s_raw = warpgroup_mma_wait(1, deps=(s_tok, ))  # the score MMA (issued first) is done
            mbarrier.arrive(kfree.index(st))
            m_i, l_i, alpha, p_op, vmax_n = _softmax_step_fp8(s_raw, q_sc, k_sc, v_sc, key0, bits, row_bit, pos,
                                                              pos_min, offs_n, m_i, l_i, BN, p_layout)
            acc = warpgroup_mma_wait(0, deps=(o_tok, ))
            mbarrier.arrive(vtfree.index(prev))
            acc = acc * gl.convert_layout(alpha * (vmax / vmax_n), row_o)[:, None]  # into the new step's units
            vmax = vmax_n
        last = (c + n_steps - 1) % STAGES
        mbarrier.wait(vtready.index(last), ((c + n_steps - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, vt_smem.index(last).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        mbarrier.arrive(vtfree.index(last))

    out, lse = _normalised(acc * vmax, m_i, l_i, row_o)
    ro = PART * WM + gl.arange(0, WM, layout=row_o)
    to, ok_o = _row_tokens(ro, TOKMAP, item, t0, q_end, G, TQ, GROUPED)
    head = g * G + ro % G
    lse_ptr = LSE + to.to(gl.int64) * (HKV * G) + head
    if QTMA:  # through this warpgroup's half of the item's bf16 Q buffer (read once, by the quantisation)
        _store_slots(out, q_smem.index(qb * 2 + PART), ODESC, TOKMAP, item, t0, q_end, g, PART, HKV, G, TQ, GROUPED)
        tma.store_wait(0)
    else:
        do = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        gl.store(OUT + to.to(gl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + do[None, :],
                 out.to(OUT.dtype.element_ty), mask=ok_o[:, None])
    gl.store(lse_ptr, lse, mask=ok_o)
    return c + n_steps


@gluon.jit
def _consumer_rare_fp8(ODESC, LSE, ITEM_TOK, ITEM_BLK, ITEM_PAGE, KS, VS, q_smem, q8_smem, vt_smem, k_smem, v_smem,
                       meta, qready, qfree, kready, vready, kfree, vfree, eready, qk_scale, PART: gl.constexpr,
                       HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr, WM: gl.constexpr, D: gl.constexpr,
                       B: gl.constexpr, BN: gl.constexpr):
    """``gluon_tile._consumer_rare`` in Q8KV8: item ``n + 1``'s Q quantised into ``q8`` (free: item
    ``n``'s score MMA is done) before its score MMA, item ``n``'s V transposed into ``vt`` (free: item
    ``n - 1``'s P V is done) before its P V; each item's P V starts from zero and is scaled by its
    unit ``vmax / 256`` before the merge."""
    gl.static_assert(B == BN, "the rare mode takes whole blocks")
    NQB: gl.constexpr = qready.shape[0]  # item slots and Q buffers (3)
    num_warps: gl.constexpr = 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    row_bit = (PART * WM + gl.arange(0, WM, layout=row_s)) // G
    s_zero = gl.zeros([WM, BN], gl.float32, layout=s_layout)
    o_zero = gl.zeros([WM, D], gl.float32, layout=o_layout)
    m_init = gl.full([WM], float("-inf"), gl.float32, layout=row_s)
    l_init = gl.zeros([WM], gl.float32, layout=row_s)
    q8_tile = q8_smem.index(PART)
    vt_tile = vt_smem.index(PART)

    n = 0
    mbarrier.wait(qready.index(0), 0)
    if _slot(meta, 0, 0) >= 0:  # (item -1: this program has no item in the round)
        item, g, key0, pos, pos_min, to, ok_o, lse_e = _rare_rows(meta, 0, ITEM_TOK, ITEM_BLK, LSE, PART, HKV, G,
                                                                 TQ, WM, B, row_s, row_o)
        q_sc = gl.convert_layout(_quantise_rows(q_smem.index(PART).load(q_layout).to(gl.float32), q8_tile),
                                 row_s) * qk_scale
        k_sc, v_sc = _key_scales(KS, VS, gl.load(ITEM_PAGE + item), g, key0, 0, _slot(meta, 0, 5), HKV, B, BN)
        mbarrier.wait(kready.index(0), 0)
        s_tok = warpgroup_mma(q8_tile, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_raw = warpgroup_mma_wait(0, deps=(s_tok, ))
        mbarrier.arrive(kfree.index(0))
        _earlier_out(ODESC, q_smem.index(PART), eready.index(PART), ITEM_TOK, item, g, PART, HKV, G, TQ)
        m_i, l_i, alpha, p_op, vmax = _softmax_step_fp8(s_raw, q_sc, k_sc, v_sc, key0, -1, row_bit, pos, pos_min,
                                                        offs_n, m_init, l_init, BN, p_layout)
        mbarrier.wait(qready.index(1 % NQB), (1 // NQB) & 1)
        item_n = _slot(meta, 1 % NQB, 0)
        while item_n >= 0:
            st = n % 2
            nn = n + 1
            qn = nn % NQB
            _, g_n, key0_n, pos_n, pos_min_n, to_n, ok_n, lse_n = _rare_rows(meta, qn, ITEM_TOK, ITEM_BLK, LSE, PART,
                                                                             HKV, G, TQ, WM, B, row_s, row_o)
            k_sc, v_sc = _key_scales(KS, VS, gl.load(ITEM_PAGE + item_n), g_n, key0_n, 0, _slot(meta, qn, 5), HKV, B,
                                     BN)
            mbarrier.wait(vready.index(st), (n // 2) & 1)
            _transpose_v(v_smem.index(st), vt_tile, D)
            o_tok = warpgroup_mma(p_op, vt_tile.permute((1, 0)), o_zero, use_acc=False, is_async=True)
            q_sc = gl.convert_layout(_quantise_rows(q_smem.index(qn * 2 + PART).load(q_layout).to(gl.float32),
                                                    q8_tile), row_s) * qk_scale
            mbarrier.wait(kready.index(nn % 2), (nn // 2) & 1)
            s_tok = warpgroup_mma(q8_tile, k_smem.index(nn % 2).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            acc = warpgroup_mma_wait(1, deps=(o_tok, ))  # P V (issued first) is done
            mbarrier.arrive(vfree.index(st))
            _rare_epilogue(acc * vmax, m_i, l_i, lse_e, to, ok_o, g, ODESC, LSE, ITEM_TOK, item,
                           q_smem.index((n % NQB) * 2 + PART), eready.index((n % NQB) * 2 + PART), (n // NQB) & 1,
                           PART, HKV, G, TQ, row_o, o_layout)
            mbarrier.arrive(qfree.index(n % NQB))
            s_raw = warpgroup_mma_wait(0, deps=(s_tok, ))
            mbarrier.arrive(kfree.index(nn % 2))
            _earlier_out(ODESC, q_smem.index(qn * 2 + PART), eready.index(qn * 2 + PART), ITEM_TOK, item_n, g_n,
                         PART, HKV, G, TQ)
            m_i, l_i, alpha, p_op, vmax = _softmax_step_fp8(s_raw, q_sc, k_sc, v_sc, key0_n, -1, row_bit, pos_n,
                                                            pos_min_n, offs_n, m_init, l_init, BN, p_layout)
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
        _transpose_v(v_smem.index(st), vt_tile, D)
        o_tok = warpgroup_mma(p_op, vt_tile.permute((1, 0)), o_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        mbarrier.arrive(vfree.index(st))
        _rare_epilogue(acc * vmax, m_i, l_i, lse_e, to, ok_o, g, ODESC, LSE, ITEM_TOK, item,
                       q_smem.index((n % NQB) * 2 + PART), eready.index((n % NQB) * 2 + PART), (n // NQB) & 1,
                       PART, HKV, G, TQ, row_o, o_layout)
        mbarrier.arrive(qfree.index(n % NQB))


@gluon.jit
def _shared_fp8(QDESC, KDESC, VDESC, NQB: gl.constexpr, NQ: gl.constexpr, NVT: gl.constexpr, WM: gl.constexpr,
                D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, QTMA: gl.constexpr, VFREE: gl.constexpr):
    """``gluon_tile._shared`` for Q8KV8: with ``QTMA`` ``NQ`` Q halves ``[WM, D]`` in Q's dtype (else the
    e4m3 ones, unused by the producer), the e4m3 K / V ring, per consumer warpgroup one e4m3 ``q8``
    ``[WM, D]``, ``NVT`` V^T buffers ``[D, BN]`` (the tile kernel's ring, or one per consumer warpgroup)
    with their ``vtready`` (one arrival) / ``vtfree`` (two) barriers, and the barriers as there (``vfree``
    of ``VFREE`` arrivals)."""
    q8_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WM, D], gl.float8e4nv)
    vt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BN], gl.float8e4nv)
    q8_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, WM, D], q8_layout)
    vt_smem = gl.allocate_shared_memory(gl.float8e4nv, [NVT, D, BN], vt_layout)
    if QTMA:
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([WM, D], QDESC.dtype)
        q_smem = gl.allocate_shared_memory(QDESC.dtype, [NQ, WM, D], q_layout)
    else:
        q_smem = q8_smem
    k_smem = gl.allocate_shared_memory(KDESC.dtype, [STAGES, BN, D], KDESC.layout)
    v_smem = gl.allocate_shared_memory(VDESC.dtype, [STAGES, BN, D], VDESC.layout)
    kready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kfree = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vfree = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vtready = gl.allocate_shared_memory(gl.int64, [NVT, 1], mbarrier.MBarrierLayout())
    vtfree = gl.allocate_shared_memory(gl.int64, [NVT, 1], mbarrier.MBarrierLayout())
    qready = gl.allocate_shared_memory(gl.int64, [NQB, 1], mbarrier.MBarrierLayout())
    qfree = gl.allocate_shared_memory(gl.int64, [NQB, 1], mbarrier.MBarrierLayout())
    meta = gl.allocate_shared_memory(gl.int32, [NQB, _META], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    for i in gl.static_range(STAGES):
        mbarrier.init(kready.index(i), count=1)
        mbarrier.init(vready.index(i), count=1)
        mbarrier.init(kfree.index(i), count=2)
        mbarrier.init(vfree.index(i), count=VFREE)
    for i in gl.static_range(NVT):
        mbarrier.init(vtready.index(i), count=1)
        mbarrier.init(vtfree.index(i), count=2)
    for i in gl.static_range(NQB):
        mbarrier.init(qready.index(i), count=1)
        mbarrier.init(qfree.index(i), count=2)
    return (q_smem, q8_smem, vt_smem, k_smem, v_smem, kready, vready, kfree, vfree, vtready, vtfree, qready, qfree,
            meta)


@gluon.jit
def _gluon_tile_fp8_kernel(Q, QDESC, KDESC, VDESC, ODESC, OUT, LSE, KS, VS, CUQ, SEQ, TILE_REQ, TILE_START, TOKMAP,
                           UNION, UPAGE, UMASK, UCOUNT, NEXT, n_items, stride_qt, stride_qh, stride_ot, stride_oh,
                           stride_ut, stride_uh, qk_scale, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr,
                           D: gl.constexpr, B: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                           GROUPED: gl.constexpr, QTMA: gl.constexpr):
    """``gluon_tile._gluon_tile_kernel`` on e4m3 caches (``KS`` / ``VS``: their fp32 scales, one per K / V
    row), its producer a warpgroup that also transposes V (``_producer_tile_fp8``)."""
    WM: gl.constexpr = TQ * G // 2
    NQ: gl.constexpr = 4 if QTMA else 2
    (q_smem, q8_smem, vt_smem, k_smem, v_smem, kready, vready, kfree, vfree, vtready, vtfree, qready, qfree,
     meta) = _shared_fp8(QDESC, KDESC, VDESC, 2, NQ, STAGES, WM, D, BN, STAGES, QTMA, 1)
    gl.warp_specialize([
        (_consumer_tile_fp8, (Q, ODESC, OUT, LSE, TOKMAP, UNION, UPAGE, UMASK, KS, VS, q_smem, q8_smem, vt_smem, k_smem,
                              meta, qready, qfree, kready, vtready, kfree, vtfree, stride_qt, stride_qh, stride_ot,
                              stride_oh, stride_ut, stride_uh, qk_scale, _PART0, HKV, G, TQ, WM, D, B, BN, STAGES,
                              GROUPED, QTMA)),
        (_consumer_tile_fp8, (Q, ODESC, OUT, LSE, TOKMAP, UNION, UPAGE, UMASK, KS, VS, q_smem, q8_smem, vt_smem, k_smem,
                              meta, qready, qfree, kready, vtready, kfree, vtfree, stride_qt, stride_qh, stride_ot,
                              stride_oh, stride_ut, stride_uh, qk_scale, _PART1, HKV, G, TQ, WM, D, B, BN, STAGES,
                              GROUPED, QTMA)),
        (_producer_tile_fp8, (QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, vt_smem, meta, qready, qfree, kready,
                              vready, kfree, vfree, vtready, vtfree, CUQ, SEQ, TILE_REQ, TILE_START, TOKMAP, UPAGE,
                              UCOUNT, NEXT, n_items, stride_ut, stride_uh, HKV, G, TQ, D, B, BN, STAGES, GROUPED,
                              QTMA)),
    ], [4, 4], [_CONSUMER_REGS, _PRODUCER_REGS])


@gluon.jit
def _gluon_rare_fp8_kernel(QDESC, KDESC, VDESC, ODESC, LSE, KS, VS, CUQ, SEQ, ITEM_TOK, ITEM_G, ITEM_REQ, ITEM_BLK,
                           ITEM_PAGE, NEXT, ROUND, qk_scale, HKV: gl.constexpr, G: gl.constexpr, TQ: gl.constexpr,
                           D: gl.constexpr, B: gl.constexpr):
    """``gluon_tile._gluon_rare_kernel`` on e4m3 caches (Q and the output stay in the model dtype); each
    consumer warpgroup transposes its item's V into its own ``vt`` buffer."""
    WM: gl.constexpr = TQ * G // 2
    (q_smem, q8_smem, vt_smem, k_smem, v_smem, kready, vready, kfree, vfree, vtready, vtfree, qready, qfree,
     meta) = _shared_fp8(QDESC, KDESC, VDESC, 3, 6, 2, WM, D, B, 2, True, 2)
    eready = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())  # earlier output per Q half
    for i in gl.static_range(6):
        mbarrier.init(eready.index(i), count=1)
    gl.warp_specialize([
        (_consumer_rare_fp8, (ODESC, LSE, ITEM_TOK, ITEM_BLK, ITEM_PAGE, KS, VS, q_smem, q8_smem, vt_smem, k_smem,
                              v_smem, meta, qready, qfree, kready, vready, kfree, vfree, eready, qk_scale, _PART0, HKV,
                              G, TQ, WM, D, B, B)),
        (_consumer_rare_fp8, (ODESC, LSE, ITEM_TOK, ITEM_BLK, ITEM_PAGE, KS, VS, q_smem, q8_smem, vt_smem, k_smem,
                              v_smem, meta, qready, qfree, kready, vready, kfree, vfree, eready, qk_scale, _PART1, HKV,
                              G, TQ, WM, D, B, B)),
        (_producer_rare, (QDESC, KDESC, VDESC, q_smem, k_smem, v_smem, meta, qready, qfree, kready, vready, kfree,
                          vfree, CUQ, SEQ, ITEM_TOK, ITEM_G, ITEM_REQ, ITEM_PAGE, NEXT, ROUND, HKV, G, TQ, B)),
    ], [4, 1], [_CONSUMER_REGS, _PRODUCER_REGS])


def smem_bytes(q_tma: bool, rows: int, d: int, block_n: int, stages: int, q_bytes: int) -> int:
    """Shared memory of the Q8KV8 tile kernel (bytes, less the barriers): four Q halves in the model dtype
    with ``q_tma``, the e4m3 K, V and V^T rings and the two warpgroups' ``q8`` buffers."""
    half = rows // 2
    return (4 * half * d * q_bytes if q_tma else 0) + 3 * stages * block_n * d + 2 * half * d


def _descriptors(q, k_cache, v_cache, out, group: int, block_n: int, q_tma: bool):
    """``gluon_tile._descriptors`` with e4m3 K / V boxes (Q and out boxes in the model dtype)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    d = q.shape[-1]
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], gl.float8e4nv)
    kdesc = TensorDescriptor.from_tensor(k_cache.view(-1, d), [block_n, d], kv_layout)
    vdesc = TensorDescriptor.from_tensor(v_cache.view(-1, d), [block_n, d], kv_layout)
    if not q_tma:
        return kdesc, kdesc, vdesc, kdesc
    dtype = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    box = gl.NVMMASharedLayout.get_default_for([group, d], dtype)
    return (TensorDescriptor.from_tensor(q.view(-1, d), [group, d], box), kdesc, vdesc,
            TensorDescriptor.from_tensor(out.view(-1, d), [group, d], box))


def _check_scales(k_cache, v_cache, k_scale, v_scale) -> None:
    """One line naming the fix unless both caches are e4m3 with contiguous fp32 scales ``[P, Hkv, B]``."""
    if not check_kv_scales("gluon Q8KV8", k_cache, v_cache, k_scale, v_scale, contiguous=True):
        raise ValueError(f"gluon Q8KV8: the K/V caches must be float8_e4m3fn, got {k_cache.dtype}; "
                         "use launch_gluon_tile for bf16 caches")


def launch_gluon_tile_fp8(plan: PrefillPlan, q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv,
                          tiles: tuple[torch.Tensor, torch.Tensor], union: TileUnions, qk_scale: float,
                          k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """``gluon_tile.launch_gluon_tile`` on e4m3 caches with their scales; Q by TMA as ``plan.q_tma`` says
    where the bf16 Q buffers fit beside the e4m3 ones (else gathered by the consumers)."""
    _check_scales(k_cache, v_cache, k_scale, v_scale)
    tile_req, tile_start = tiles
    hkv, block, d = k_cache.shape[1], k_cache.shape[2], q.shape[-1]
    group = q.shape[1] // hkv
    q_tma = plan.q_tma and smem_bytes(True, plan.tile_q * group, d, plan.block_n, plan.num_stages,
                                      q.element_size()) + 1024 <= _SMEM_BYTES
    need = smem_bytes(False, plan.tile_q * group, d, plan.block_n, plan.num_stages, q.element_size()) + 1024
    if need > _SMEM_BYTES:
        raise ValueError(f"gluon Q8KV8: {plan.num_stages} stages of {plan.block_n} keys need {need} bytes of shared "
                         f"memory (more than {_SMEM_BYTES}); use fewer stages or a smaller block_n")
    qdesc, kdesc, vdesc, odesc = _descriptors(q, k_cache, v_cache, out, group, plan.block_n, q_tma)
    tokmap = union.tokmap if union.tokmap is not None else union.count
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    _gluon_tile_fp8_kernel[(plan.programs,)](
        q, qdesc, kdesc, vdesc, odesc, out, lse, k_scale, v_scale, cu_seqlens_q, seq_lens_kv, tile_req, tile_start,
        tokmap, union.union, union.pages, union.token_mask, union.count, counter, tile_req.shape[0] * hkv,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), union.union.stride(0), union.union.stride(1),
        qk_scale, HKV=hkv, G=group, TQ=plan.tile_q, D=d, B=block, BN=plan.block_n, STAGES=plan.num_stages,
        GROUPED=union.tokmap is not None, QTMA=q_tma, num_warps=4)


def launch_gluon_rare_fp8(plan: PrefillPlan, q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv,
                          items: RareItems, qk_scale: float, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """``gluon_tile.launch_gluon_rare`` on e4m3 caches with their scales."""
    _check_scales(k_cache, v_cache, k_scale, v_scale)
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // hkv
    qdesc, kdesc, vdesc, odesc = _descriptors(q, k_cache, v_cache, out, group, block, True)
    rounds = items.round_start.shape[0] - 1
    counters = torch.zeros(rounds, dtype=torch.int32, device=q.device)
    for r in range(rounds):
        _gluon_rare_fp8_kernel[(plan.rare_programs,)](
            qdesc, kdesc, vdesc, odesc, lse, k_scale, v_scale, cu_seqlens_q, seq_lens_kv, items.tok, items.g,
            items.req, items.blk, items.page, counters[r:], items.round_start[r:], qk_scale, HKV=hkv, G=group,
            TQ=plan.tile_q, D=q.shape[-1], B=block, num_warps=4)
