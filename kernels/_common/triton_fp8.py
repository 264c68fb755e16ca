"""The rounding of Triton kernels that quantise on the fly. e4m3 (the indexer's fp8 dot, the Q8KV8 prefill):
the rule of ``kernels._common.fp8`` (``scale = max(amax |x|, 1e-12) / 448`` per row), in fp32 under the
interpreter (``UPCAST``): the interpreter's fp32 -> fp8 cast is wrong where rounding carries into the exponent
(31.99 -> 16 instead of 32), so ``_round_e4m3`` computes the nearest e4m3 value itself. int8 (the queries
scored against int8 index keys): the rule of ``kernels._common.int8`` (``/ 127``, to nearest, ties to even).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _round_e4m3(y):
    """fp32 ``y`` with ``|y| <= 448`` -> the nearest e4m3 value (ties to even), still fp32: the ulp is
    ``2^(e - 3)`` for the binade ``e`` (at least -6: subnormals), the rounding the fp32 add of 1.5 * 2^23."""
    e = tl.maximum(((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    ulp = ((e + 124) << 23).to(tl.float32, bitcast=True)
    r = ((y / ulp + 12582912.0) - 12582912.0) * ulp
    return tl.minimum(tl.maximum(r, -448.0), 448.0)


@triton.jit
def _round_e4m3_kernel(X, Y, N: tl.constexpr):
    """``Y = _round_e4m3(X)`` over ``N`` fp32 values: the emulated rounding alone, for its test."""
    o = tl.arange(0, N)
    tl.store(Y + o, _round_e4m3(tl.load(X + o)))


@triton.jit
def _to_e4m3(y, UPCAST: tl.constexpr):
    """fp32 ``|y| <= 448`` -> e4m3 (under the interpreter: fp32 holding the e4m3 value, ``_round_e4m3``)."""
    if UPCAST:
        return _round_e4m3(y)
    return y.to(tl.float8e4nv)


@triton.jit
def _quantize_rows(q, UPCAST: tl.constexpr):
    """Rows of ``q`` ``[M, D]`` -> (e4m3 rows, fp32 row scales ``[M]``) by the rule of ``kernels._common.fp8``."""
    qf = q.to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(qf), axis=1), 1e-12) / 448.0
    return _to_e4m3(tl.div_rn(qf, q_scale[:, None]), UPCAST), q_scale


@triton.jit
def _quantize_int8_rows(q, UPCAST: tl.constexpr):
    """Rows of ``q`` ``[M, D]`` -> (int8 rows, fp32 row scales ``[M]``) by the rule of ``kernels._common.int8``;
    under ``UPCAST`` (the interpreter, fp32 dots) the rows stay fp32 holding the integers. The rounding is the
    fp32 add of 1.5 * 2^23 (to nearest, ties to even, as ``torch.round``)."""
    qf = q.to(tl.float32)
    q_scale = tl.maximum(tl.max(tl.abs(qf), axis=1), 1e-12) / 127.0
    r = (tl.div_rn(qf, q_scale[:, None]) + 12582912.0) - 12582912.0
    if UPCAST:
        return r, q_scale
    return r.to(tl.int8), q_scale
