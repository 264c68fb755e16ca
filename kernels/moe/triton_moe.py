"""Triton kernels of the MoE: the fused router (logits, sigmoid, biased top-k, renormalised weights) and
the two grouped GEMMs over expert-sorted, ``BLOCK_M``-aligned row blocks (see ``align.py``).

* ``_route_kernel``: ``BLOCK_T`` tokens x all experts per program; logits accumulate in fp32 over the
  hidden dim, then k rounds of max / arg-max (ties to the smaller id) over ``s + bias``.
* ``_gate_up_kernel``: one ``[BLOCK_M, BLOCK_N]`` tile of ``h`` = SwiGLU-OAI of the gate and up halves of
  ``x @ W13[e]^T`` (two accumulators, the same x tile), rows gathered through the sorted token ids.
* ``_down_kernel``: one ``[BLOCK_M, BLOCK_N]`` tile of ``h @ W2[e]^T`` times the row's routing weight and
  the scaling, written to its (token, slot) row of a ``[T*k, H]`` buffer (the op sums the k slots).

Blocks past the last expert's segment (``block_expert = -1``) exit at once, so the grid is sized from
shapes alone (no host sync, CUDA-graph safe). ``UPCAST``: the interpreter casts dot operands to fp32
(its bf16 dot is wrong); fp32 inputs use the full-precision (``ieee``) dot.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _route_kernel(x_ptr, w_ptr, bias_ptr, weights_ptr, ids_ptr, T, H, E, sxt, swe,
                  TOPK: tl.constexpr, KP: tl.constexpr, BLOCK_T: tl.constexpr, EP: tl.constexpr,
                  BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, EP)
    row_ok = rows < T
    e_ok = experts < E
    acc = tl.zeros((BLOCK_T, EP), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < H
        a = tl.load(x_ptr + rows[:, None] * sxt + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptr + experts[None, :] * swe + ks[:, None], mask=e_ok[None, :] & k_ok[:, None], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    scores = tl.sigmoid(acc)
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + experts, mask=e_ok, other=0.0).to(tl.float32)[None, :]
    choice = tl.where(e_ok[None, :], choice, float("-inf"))
    slots = tl.arange(0, KP)
    w_out = tl.zeros((BLOCK_T, KP), dtype=tl.float32)
    id_out = tl.zeros((BLOCK_T, KP), dtype=tl.int32)
    for j in tl.static_range(TOPK):
        best = tl.max(choice, axis=1)
        pick = tl.min(tl.where(choice == best[:, None], experts[None, :], EP), axis=1)
        hit = experts[None, :] == pick[:, None]
        wj = tl.sum(tl.where(hit, scores, 0.0), axis=1)
        w_out = tl.where(slots[None, :] == j, wj[:, None], w_out)
        id_out = tl.where(slots[None, :] == j, pick[:, None], id_out)
        choice = tl.where(hit, float("-inf"), choice)
    w_out = w_out / tl.sum(w_out, axis=1)[:, None]
    out_off = rows[:, None] * TOPK + slots[None, :]
    out_ok = row_ok[:, None] & (slots[None, :] < TOPK)
    tl.store(weights_ptr + out_off, w_out, mask=out_ok)
    tl.store(ids_ptr + out_off, id_out, mask=out_ok)


@triton.jit
def _tile(pid, n_blocks, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column tile) of program ``pid``: GROUP_M row blocks (about one expert) sweep the
    column tiles together, so their weight tiles are read from L2 once per group."""
    n_tiles = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_tiles
    first = (pid // per_group) * GROUP_M
    size = tl.minimum(n_blocks - first, GROUP_M)
    return first + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, sorted_ptr, block_expert_ptr, h_ptr, n_blocks, n_valid, N, K,
                    sxt, swe, swn, shm, alpha, limit,
                    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), n_blocks, N, BLOCK_N, GROUP_M)
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    flat = tl.load(sorted_ptr + rows)
    valid = flat < n_valid
    tok = tl.where(valid, flat // TOPK, 0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tok[:, None].to(tl.int64) * sxt + ks[None, :]
    g_ptrs = w_ptr + e.to(tl.int64) * swe + cols[None, :].to(tl.int64) * swn + ks[:, None]
    u_ptrs = g_ptrs + N * swn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            g = tl.load(g_ptrs, mask=col_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + ks) < K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        if UPCAST:
            a, g, u = a.to(tl.float32), g.to(tl.float32), u.to(tl.float32)
        if IEEE:
            acc_g += tl.dot(a, g, input_precision="ieee")
            acc_u += tl.dot(a, u, input_precision="ieee")
        else:
            acc_g += tl.dot(a, g)
            acc_u += tl.dot(a, u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    gate = tl.minimum(acc_g, limit)
    up = tl.minimum(tl.maximum(acc_u, -limit), limit)
    h = (up + 1.0) * gate * tl.sigmoid(alpha * gate)
    out = h_ptr + rows[:, None].to(tl.int64) * shm + cols[None, :]
    tl.store(out, h.to(h_ptr.dtype.element_ty), mask=col_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, sorted_ptr, block_expert_ptr, weights_ptr, out_ptr, n_blocks, n_valid, N, K,
                 shm, swe, swn, som, scaling,
                 TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), n_blocks, N, BLOCK_N, GROUP_M)
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    flat = tl.load(sorted_ptr + rows)
    valid = flat < n_valid
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + rows[:, None].to(tl.int64) * shm + ks[None, :]
    b_ptrs = w_ptr + e.to(tl.int64) * swe + cols[None, :].to(tl.int64) * swn + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = (k0 + ks) < K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=col_ok[None, :] & k_ok[:, None], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    w = tl.load(weights_ptr + flat, mask=valid, other=0.0) * scaling
    acc = acc * w[:, None]
    dst = out_ptr + tl.where(valid, flat, 0)[:, None].to(tl.int64) * som + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_ok[None, :])
