"""Fused small ops of the decoder hot path: residual-add + RMSNorm, RoPE + KV-cache write, SwiGLU, and
the decode graphs' input-id select (previous step's device tokens or host tokens).

Each op has a torch reference (the CPU path, bit-identical to the unfused model code) and a
Triton kernel (one launch instead of 3-8 elementwise kernels). `impl="auto"`: Triton on CUDA
tensors, the reference on CPU tensors; `"triton"` on CPU needs TRITON_INTERPRET=1.

Shapes: tokens packed `[T, ...]`; caches `[num_pages, Hkv, B, d]`; cos/sin fp32 `[T, d]`
(rotate-half convention, `engine.rope`). An FP8 cache (`engine.kv_cache`) comes with fp32 scales
`[num_pages, Hkv, B]`: `rope_cache` quantises each rotated K row and each V row by `kernels._common.fp8`'s
rule (from the fp32 rotation, not a bf16-rounded one) and writes its scale in the same launch; with the
fp8-hadamard rotation (`rotation`) q and K are multiplied by it in the same launch, before K's scale is taken.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kv_cache import as_bytes
from engine.rope import apply_rope
from kernels._common.device import interpreting
from kernels._common.fp8 import E4M3_MAX, quantize_rows
from kernels._common.validate import check_kv_scales
from kernels._common.validate import resolve_impl as _resolve_impl


def resolve_impl(impl: str, device: torch.device) -> str:
    """"auto" -> Triton on CUDA tensors, torch reference otherwise (the kernels' one rule)."""
    return _resolve_impl(impl, device, "engine.gpu.ops")


# -- RMSNorm (optionally after a residual add) ---------------------------------------------
def rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * w.float()).to(x.dtype)


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, n, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
    if HAS_RES:
        x = x + tl.load(r_ptr + row * n + cols, mask=mask, other=0.0)  # add in the storage dtype, like torch
        tl.store(sum_ptr + row * n + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (xf * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             impl: str = "auto") -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x `[T, n]` -> RMSNorm(x) * w. With `residual` `[T, n]`: s = x + residual, returns (norm(s), s)."""
    if resolve_impl(impl, x.device) == "torch":
        if residual is None:
            return rms_norm_ref(x, w, eps)
        s = x + residual
        return rms_norm_ref(s, w, eps), s
    if x.ndim != 2 or not x.is_contiguous() or w.shape != (x.shape[1],):
        raise ValueError(f"rms_norm: x must be contiguous [T, n] and w [n], got {tuple(x.shape)}, {tuple(w.shape)}")
    out = torch.empty_like(x)
    s = torch.empty_like(x) if residual is not None else x
    if residual is not None and (residual.shape != x.shape or not residual.is_contiguous()):
        raise ValueError(f"rms_norm: residual must be contiguous {tuple(x.shape)}")
    if x.shape[0]:
        _rms_norm_kernel[(x.shape[0],)](x, residual if residual is not None else x, w, out, s, x.shape[1], eps,
                                        HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(x.shape[1]),
                                        num_warps=4 if x.shape[1] <= 4096 else 8)
    return out if residual is None else (out, s)


# -- RoPE on q and k, K/V written into the paged cache ---------------------------------------
def rope_cache_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_pages: torch.Tensor, slot_offsets: torch.Tensor,
                   num_heads: int, num_kv_heads: int, k_scale: torch.Tensor | None = None,
                   v_scale: torch.Tensor | None = None, rotation: torch.Tensor | None = None) -> torch.Tensor:
    d = k_cache.shape[-1]
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    quant = k_scale is not None and v_scale is not None
    # K rotated in fp32 when it is quantised or multiplied by `rotation` (what the kernel does), else in its dtype
    k = apply_rope((k.float() if quant or rotation is not None else k).reshape(-1, num_kv_heads, d), cos, sin)
    v = v.reshape(-1, num_kv_heads, d)
    if rotation is not None:  # fp8-hadamard: q and K times the rotation after RoPE, in fp32
        q = (apply_rope(q.float().reshape(-1, num_heads, d), cos, sin) @ rotation).to(qkv.dtype)
        k = k @ rotation
    else:
        q = apply_rope(q.reshape(-1, num_heads, d), cos, sin)
    if k_scale is not None and v_scale is not None:  # FP8: the codes and scales of the fp32 values
        k8, ks = quantize_rows(k)
        v8, vs = quantize_rows(v)
        as_bytes(k_cache)[slot_pages, :, slot_offsets], k_scale[slot_pages, :, slot_offsets] = as_bytes(k8), ks
        as_bytes(v_cache)[slot_pages, :, slot_offsets], v_scale[slot_pages, :, slot_offsets] = as_bytes(v8), vs
        return q
    k_cache[slot_pages, :, slot_offsets] = k.to(k_cache.dtype)
    v_cache[slot_pages, :, slot_offsets] = v.to(v_cache.dtype)
    return q


@triton.jit
def _e4m3_grid(x):
    """fp32 x (|x| <= 448) rounded to nearest even on the e4m3 grid, in fp32: the interpreter's own fp32 -> fp8
    cast rounds halves away and drops the carry into the exponent (125.9 -> 64), so under it the kernel rounds
    here and the cast is exact. On a GPU the hardware cast (cvt.rn.satfinite) does this."""
    e = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # subnormals: spacing 2^-9
    spacing = ((e + 124) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3): 3 mantissa bits
    return ((x / spacing + 12582912.0) - 12582912.0) * spacing  # 1.5 * 2^23: fp32 add rounds to nearest even


@triton.jit
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, rot_ptr, q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, pages_ptr, offs_ptr,
                       HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                       QUANT: tl.constexpr, ROTATE: tl.constexpr, FP8_MAX: tl.constexpr, EXACT_ROUND: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cols = tl.arange(0, D)
    row = qkv_ptr + t * (HQ + 2 * HKV) * D + h * D
    if h < HQ + HKV:  # q or k head: RoPE, rotate-half (y = x cos + [-x2, x1] sin), in fp32
        x = tl.load(row + cols).to(tl.float32)
        xr = tl.load(row + (cols + D // 2) % D).to(tl.float32)
        xr = tl.where(cols < D // 2, -xr, xr)
        y = x * tl.load(cos_ptr + t * D + cols) + xr * tl.load(sin_ptr + t * D + cols)
        if ROTATE:  # fp8-hadamard: y @ R (R `[D, D]` fp32, KVCache.k_rotation), before K's scale is taken
            y = tl.sum(y[:, None] * tl.load(rot_ptr + cols[:, None] * D + cols[None, :]), axis=0)
        if h < HQ:
            qdst = q_ptr + t * HQ * D + h * D  # its own name: Triton 3.6 types a name once across if/else
            tl.store(qdst + cols, y.to(qdst.dtype.element_ty))
        else:
            page = tl.load(pages_ptr + t)
            off = tl.load(offs_ptr + t)
            slot = (page * HKV + (h - HQ)) * PAGE + off
            if QUANT:  # kernels._common.fp8: scale = max(amax, 1e-12) / 448, codes = e4m3(clamp(y / scale))
                scale = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12) / FP8_MAX
                y = tl.minimum(tl.maximum(y / scale, -FP8_MAX), FP8_MAX)
                if EXACT_ROUND:
                    y = _e4m3_grid(y)
                tl.store(ks_ptr + slot, scale)
            tl.store(kc_ptr + slot * D + cols, y.to(kc_ptr.dtype.element_ty))
    else:  # v head: copy (quantise)
        page = tl.load(pages_ptr + t)
        off = tl.load(offs_ptr + t)
        slot = (page * HKV + (h - HQ - HKV)) * PAGE + off
        x = tl.load(row + cols)
        if QUANT:
            xf = x.to(tl.float32)
            scale = tl.maximum(tl.max(tl.abs(xf), axis=0), 1e-12) / FP8_MAX
            tl.store(vs_ptr + slot, scale)
            y = tl.minimum(tl.maximum(xf / scale, -FP8_MAX), FP8_MAX)
            if EXACT_ROUND:
                y = _e4m3_grid(y)
            tl.store(vc_ptr + slot * D + cols, y.to(vc_ptr.dtype.element_ty))
        else:
            tl.store(vc_ptr + slot * D + cols, x.to(vc_ptr.dtype.element_ty))


def rope_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slot_pages: torch.Tensor, slot_offsets: torch.Tensor,
               num_heads: int, num_kv_heads: int, impl: str = "auto", k_scale: torch.Tensor | None = None,
               v_scale: torch.Tensor | None = None, rotation: torch.Tensor | None = None) -> torch.Tensor:
    """qkv `[T, (Hq + 2 Hkv) d]` -> q `[T, Hq, d]` with RoPE; K (with RoPE) and V go to the cache slots
    (`slot_pages`, `slot_offsets` int64 `[T]`); FP8 caches take their per-row scales in `k_scale`, `v_scale`.
    `rotation` (fp32 `[d, d]`, `KVCache.k_rotation` of fp8-hadamard): q and K multiplied by it after RoPE."""
    quant = check_kv_scales("rope_cache", k_cache, v_cache, k_scale, v_scale, contiguous=True)
    d = k_cache.shape[-1]
    if rotation is not None and (rotation.shape != (d, d) or rotation.dtype != torch.float32
                                 or rotation.device != qkv.device or not rotation.is_contiguous()):
        raise ValueError(f"rope_cache: rotation must be a contiguous float32 [{d}, {d}] on {qkv.device}, got "
                         f"{rotation.dtype} {tuple(rotation.shape)} on {rotation.device}")
    if resolve_impl(impl, qkv.device) == "torch":
        return rope_cache_ref(qkv, cos, sin, k_cache, v_cache, slot_pages, slot_offsets, num_heads, num_kv_heads,
                              k_scale, v_scale, rotation)
    if quant:
        from kernels._common.fp8 import require_fp8

        require_fp8("rope_cache", qkv.device)
    t = qkv.shape[0]
    if not qkv.is_contiguous() or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * d:
        raise ValueError(f"rope_cache: qkv must be contiguous [T, {(num_heads + 2 * num_kv_heads) * d}]")
    if cos.dtype != torch.float32 or cos.shape != (t, d) or not (cos.is_contiguous() and sin.is_contiguous()):
        raise ValueError(f"rope_cache: cos/sin must be contiguous float32 [{t}, {d}]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("rope_cache: caches must be contiguous [num_pages, Hkv, B, d]")
    q = torch.empty(t, num_heads, d, dtype=qkv.dtype, device=qkv.device)
    if t:
        ks = k_scale if k_scale is not None else cos  # unused without QUANT
        vs = v_scale if v_scale is not None else cos
        _rope_cache_kernel[(t, num_heads + 2 * num_kv_heads)](
            qkv, cos, sin, rotation if rotation is not None else cos, q, k_cache, v_cache, ks, vs, slot_pages,
            slot_offsets, HQ=num_heads, HKV=num_kv_heads, D=d, PAGE=k_cache.shape[2], QUANT=quant,
            ROTATE=rotation is not None, FP8_MAX=E4M3_MAX, EXACT_ROUND=quant and interpreting(),
            num_warps=1 if rotation is None else 4 if d <= 64 else 8)
    return q


# -- SwiGLU ------------------------------------------------------------------------------
def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(gu_ptr + row * 2 * n + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * n + n + cols, mask=mask, other=0.0)
    act = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # round like torch: silu in fp32 -> dtype, then * up
    tl.store(out_ptr + row * n + cols, act * u, mask=mask)


def silu_mul(gate_up: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """gate_up `[T, 2 I]` (gate first) -> silu(gate) * up `[T, I]`."""
    if resolve_impl(impl, gate_up.device) == "torch":
        return silu_mul_ref(gate_up)
    if gate_up.ndim != 2 or not gate_up.is_contiguous() or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up must be contiguous [T, 2*I], got {tuple(gate_up.shape)}")
    t, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(t, n, dtype=gate_up.dtype, device=gate_up.device)
    if t:
        block = min(1024, triton.next_power_of_2(n))
        _silu_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, n, BLOCK=block, num_warps=4)
    return out


# -- decode input ids: the previous step's sampled tokens or host tokens ------------------------
def select_ids_ref(src_rows: torch.Tensor, host_ids: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.where(src_rows >= 0, tokens[src_rows.clamp(min=0)], host_ids)


@triton.jit
def _select_ids_kernel(src_ptr, host_ptr, tok_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    mask = i < n
    src = tl.load(src_ptr + i, mask=mask, other=-1)
    host = tl.load(host_ptr + i, mask=mask, other=0)
    prev = tl.load(tok_ptr + tl.maximum(src, 0), mask=mask & (src >= 0), other=0)
    tl.store(out_ptr + i, tl.where(src >= 0, prev, host), mask=mask)


def select_ids(src_rows: torch.Tensor, host_ids: torch.Tensor, tokens: torch.Tensor,
               impl: str = "auto") -> torch.Tensor:
    """Input ids `[n]` int64 of a decode step: `tokens[src_rows[i]]` (the token the previous step sampled
    for that request, still on the device) where `src_rows[i] >= 0`, else `host_ids[i]`. One launch."""
    if resolve_impl(impl, src_rows.device) == "torch":
        return select_ids_ref(src_rows, host_ids, tokens)
    n = src_rows.shape[0]
    if src_rows.shape != host_ids.shape or src_rows.dtype != torch.long or host_ids.dtype != torch.long \
            or tokens.dtype != torch.long or not (src_rows.is_contiguous() and host_ids.is_contiguous()):
        raise ValueError("select_ids: src_rows and host_ids must be contiguous int64 [n], tokens int64")
    out = torch.empty(n, dtype=torch.long, device=src_rows.device)
    if n:
        _select_ids_kernel[(1,)](src_rows, host_ids, tokens, out, n, BLOCK=triton.next_power_of_2(n), num_warps=1)
    return out
