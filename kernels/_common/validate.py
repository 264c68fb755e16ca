"""Launcher-side input checks shared by the MSA ops: one ``ValueError`` naming what was expected.

Kernel bodies assume what these functions establish: dtypes, ranks, sizes, unit stride on the
last dim, one device for every tensor, and (when asked) a well-formed top-k id tensor.
"""
from __future__ import annotations

import os
from typing import Iterable

import torch

IMPLS = ("auto", "triton", "torch")


def resolve_impl(impl: str, device: torch.device, op: str) -> str:
    """Return ``"triton"`` or ``"torch"``: auto = Triton on CUDA, torch on CPU; never a silent fallback."""
    if impl not in IMPLS:
        raise ValueError(f"{op}: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if impl == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{op}: impl='triton' needs CUDA tensors (got {device}); "
                         "use impl='torch' or set TRITON_INTERPRET=1")
    return impl


def check_tensor(op: str, name: str, t, *, ndim: int, dtypes: Iterable[torch.dtype],
                 device: torch.device | None = None, last_dim_contiguous: bool = True) -> None:
    """Check type, rank, dtype, device and unit stride of the last dim of one input."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dims, got shape {tuple(t.shape)}")
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{op}: {name} must be one of ({names}), got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device}, expected {device} like the queries")
    if last_dim_contiguous and t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{op}: {name} needs a unit stride on its last dim, got strides {t.stride()}; "
                         "pass .contiguous()")


def check_size(op: str, name: str, got: int, expected: int, what: str) -> None:
    if got != expected:
        raise ValueError(f"{op}: {name} must have {what} = {expected}, got {got}")


def check_choice(op: str, name: str, value: int, allowed: Iterable[int]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{op}: {name} must be one of {allowed}, got {value}")


def check_lengths(op: str, cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor, total_q: int,
                  page_table: torch.Tensor, block_size: int, values: bool = True) -> None:
    """cu_seqlens_q ``[R+1]`` from 0 to T, non-decreasing; ``q_len <= kv_len <= max_pages * B``.

    Reads the small length tensors on the host (one sync): cheap next to any prefill, but a stall
    per layer in an engine step; ``values=False`` checks the shapes only (no sync), for callers that
    built the lengths themselves (the engine).
    """
    r = seq_lens_kv.shape[0]
    check_size(op, "cu_seqlens_q", cu_seqlens_q.shape[0], r + 1, "len(seq_lens_kv) + 1 entries")
    check_size(op, "page_table", page_table.shape[0], r, "one row per request (rows)")
    if not values:
        return
    cq = cu_seqlens_q.tolist()
    lens = seq_lens_kv.tolist()
    if cq[0] != 0 or cq[-1] != total_q:
        raise ValueError(f"{op}: cu_seqlens_q must start at 0 and end at T={total_q}, got {cq[0]}..{cq[-1]}")
    cap = page_table.shape[1] * block_size
    for i in range(r):
        q_len = cq[i + 1] - cq[i]
        if q_len < 0:
            raise ValueError(f"{op}: cu_seqlens_q must be non-decreasing (request {i})")
        if not q_len <= lens[i] <= cap:
            raise ValueError(f"{op}: request {i} needs q_len <= seq_lens_kv <= max_pages*B, "
                             f"got q_len={q_len}, kv_len={lens[i]}, capacity={cap}")


def check_topk_ids(op: str, topk_ids: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   seq_lens_kv: torch.Tensor, block_size: int) -> None:
    """Ids ``[T, Hkv, k]``: a valid prefix of distinct ids each <= the query's own block, then -1."""
    if topk_ids.numel() == 0:
        return
    dev = topk_ids.device
    t_total = topk_ids.shape[0]
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    req = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=dev), q_lens, output_size=t_total)
    pos = seq_lens_kv.long()[req] - q_lens[req] + (torch.arange(t_total, device=dev) - cu_seqlens_q.long()[req])
    local = (pos // block_size)[:, None, None]
    ids = topk_ids.long()
    valid = ids >= 0
    bad_value = (ids < -1) | (ids > local)
    bad_prefix = (~valid[..., :-1]) & valid[..., 1:]
    srt = torch.sort(ids, dim=-1).values
    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
    flags = torch.stack([bad_value.any(), bad_prefix.any(), dup.any()]).tolist()
    if flags[0]:
        raise ValueError(f"{op}: topk_ids must be -1 or a block id in [0, own block], found out-of-range ids")
    if flags[1]:
        raise ValueError(f"{op}: topk_ids must hold a valid prefix followed by -1 padding")
    if flags[2]:
        raise ValueError(f"{op}: topk_ids must not repeat a block id within one (token, KV head)")


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1. Its numpy ``tl.dot`` misreads bf16 operands as integers
    (triton 3.9), so kernels get an ``UPCAST`` flag that casts dot operands to fp32 there."""
    return os.environ.get("TRITON_INTERPRET") == "1"
