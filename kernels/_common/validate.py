"""Input checks of the MSA ops, and their one device -> implementation rule.

Each failure is one ``ValueError`` naming the op and what was expected. Kernel bodies assume what
these functions establish: dtypes, ranks, sizes, unit stride on the last dim, one device for every
tensor, and (when asked) well-formed lengths, page ids and top-k ids. The checks that read tensor
values (``check_lengths``, ``check_decode_lengths``, ``check_topk_ids``) are a host sync; the others
look only at shapes, dtypes, strides and devices, so a CUDA-graph-captured ``run()`` can call them.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from kernels._common.device import interpreting

IMPLS = ("auto", "triton", "torch")
MAX_Q_LEN = 16  # decode: one main token plus drafts
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_KEY_DTYPES = FLOAT_DTYPES + (torch.float8_e4m3fn, torch.int8)  # (int8: decode only)
SCALED_INDEX_KEYS = (torch.float8_e4m3fn, torch.int8)  # one fp32 scale per token beside the keys
KV_CACHE_DTYPES = FLOAT_DTYPES + (torch.float8_e4m3fn,)  # decode K/V: fp8 with per-token fp32 scales


def resolve_impl(impl: str, device: torch.device, op: str) -> str:
    """Return ``"triton"`` or ``"torch"``: auto = Triton on CUDA, torch on CPU; never a silent fallback."""
    if impl not in IMPLS:
        raise ValueError(f"{op}: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if impl == "triton" and device.type != "cuda" and not interpreting():
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


# -- lengths: q_len <= kv_len <= max_pages * B, for packed prefill and for decode -------------------

def check_kv_lengths(op: str, q_lens: torch.Tensor, kv_lens: torch.Tensor, max_pages: int, block_size: int) -> None:
    """Host tensors ``[R]``: every request needs ``q_len <= kv_len <= max_pages * B``."""
    cap = max_pages * block_size
    short, long = kv_lens < q_lens, kv_lens > cap
    if not (short.any() or long.any()):
        return
    i = int((short | long).nonzero()[0])
    head = f"{op}: request {i} needs q_len <= seq_lens_kv <= max_pages*B: its seq_len {int(kv_lens[i])}"
    if short[i]:
        raise ValueError(f"{head} must be >= q_len={int(q_lens[i])} (seq lens include the new tokens)")
    raise ValueError(f"{head} exceeds the page-table capacity max_pages*B = {max_pages}*{block_size} = {cap}; "
                     "widen page_table")


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
    cq = cu_seqlens_q.cpu().long()
    if int(cq[0]) != 0 or int(cq[-1]) != total_q:
        raise ValueError(f"{op}: cu_seqlens_q must start at 0 and end at T={total_q}, got {int(cq[0])}..{int(cq[-1])}")
    q_lens = cq[1:] - cq[:-1]
    if (q_lens < 0).any():
        raise ValueError(f"{op}: cu_seqlens_q must be non-decreasing (request {int((q_lens < 0).nonzero()[0])})")
    check_kv_lengths(op, q_lens, seq_lens_kv.cpu().long(), page_table.shape[1], block_size)


def check_q_len(op: str, q_len: int) -> None:
    if not isinstance(q_len, int) or not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"{op}: q_len must be an int in 1..{MAX_Q_LEN} (1 main token + drafts), got {q_len!r}")


def check_decode_metadata(op: str, seq_lens: torch.Tensor, page_table: torch.Tensor, q_len: int) -> None:
    """Shapes and dtypes of the decode metadata: seq_lens int32 ``[R]``, page_table int32 ``[R, max_pages]``."""
    check_q_len(op, q_len)
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1:
        raise ValueError(f"{op}: seq_lens must be int32 [R], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if page_table.dtype != torch.int32 or page_table.dim() != 2:
        raise ValueError(f"{op}: page_table must be int32 [R, max_pages], got {page_table.dtype} "
                         f"{tuple(page_table.shape)}")
    if page_table.shape[0] != seq_lens.shape[0]:
        raise ValueError(f"{op}: page_table has {page_table.shape[0]} rows but seq_lens has {seq_lens.shape[0]} "
                         "requests")
    if seq_lens.shape[0] == 0:
        raise ValueError(f"{op}: seq_lens is empty: a decode batch needs at least one request")
    if page_table.stride(1) != 1:
        raise ValueError(f"{op}: page_table rows must be contiguous (stride(1) == 1); pass page_table.contiguous()")
    if seq_lens.device != page_table.device:
        raise ValueError(f"{op}: seq_lens is on {seq_lens.device} but page_table is on {page_table.device}")


def check_decode_lengths(op: str, seq_lens: torch.Tensor, page_table: torch.Tensor, q_len: int, page_size: int,
                         num_pages: int | None = None) -> None:
    """Decode metadata values (host sync): ``q_len <= seq_len <= max_pages * B`` and, given num_pages,
    every page a request uses is a valid physical page."""
    check_decode_metadata(op, seq_lens, page_table, q_len)
    lens = seq_lens.cpu().long()
    check_kv_lengths(op, torch.full_like(lens, q_len), lens, page_table.shape[1], page_size)
    if num_pages is not None:
        used = (lens + page_size - 1) // page_size
        cols = torch.arange(page_table.shape[1])[None, :] < used[:, None]
        pages = page_table.cpu()[cols]
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
            raise ValueError(f"{op}: page_table holds page ids outside [0, {num_pages}) for pages the requests use")


# -- decode tensors ----------------------------------------------------------------------------------

def check_cache(op: str, name: str, cache: torch.Tensor, num_kv_heads: int | None, page_size: int | None,
                head_dim: int | None, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """``[P, Hkv, B, d]`` paged K or V cache with a contiguous last dim."""
    if cache.dim() != 4:
        raise ValueError(f"{op}: {name} must be [num_pages, Hkv, B, d], got shape {tuple(cache.shape)}")
    if cache.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{op}: {name} dtype must be one of ({names}), got {cache.dtype}")
    if cache.stride(3) != 1:
        raise ValueError(f"{op}: {name} last dim must be contiguous")
    got = (cache.shape[1], cache.shape[2], cache.shape[3])
    for g, w, what in zip(got, (num_kv_heads, page_size, head_dim), ("Hkv", "B", "d"), strict=True):
        if w is not None and g != w:
            raise ValueError(f"{op}: {name} {what} is {g}, expected {w} (shape [num_pages, Hkv, B, d])")


def check_query(op: str, name: str, q: torch.Tensor, tokens: int, heads: int | None, dim: int | None,
                dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> None:
    """``[T, H, d]`` queries with a contiguous last dim."""
    if q.dim() != 3:
        raise ValueError(f"{op}: {name} must be [R*q_len, H, d], got shape {tuple(q.shape)}")
    if q.dtype not in dtypes:
        raise ValueError(f"{op}: {name} dtype must be one of {[str(d) for d in dtypes]}, got {q.dtype}")
    if q.shape[0] != tokens:
        raise ValueError(f"{op}: {name} has {q.shape[0]} tokens, expected R*q_len = {tokens}")
    if heads is not None and q.shape[1] != heads:
        raise ValueError(f"{op}: {name} has {q.shape[1]} heads, expected {heads}")
    if dim is not None and q.shape[2] != dim:
        raise ValueError(f"{op}: {name} head dim is {q.shape[2]}, expected {dim}")
    if q.stride(2) != 1:
        raise ValueError(f"{op}: {name} last dim must be contiguous")


def check_attention_tensors(op: str, q, k_cache, v_cache, tokens: int, k_scale=None,
                            v_scale=None) -> tuple[int, int, int, int]:
    """q ``[T, Hq, d]`` against the caches ``[P, Hkv, B, d]``; returns (Hq, Hkv, B, d).

    bf16/fp16/fp32 caches share q's dtype and take no scales; float8_e4m3fn caches (both K and V) take
    q in bf16/fp16/fp32 and need ``k_scale``/``v_scale`` (``check_kv_scales``).
    """
    check_cache(op, "k_cache", k_cache, None, None, None, KV_CACHE_DTYPES)
    _, hkv, page, d = k_cache.shape
    check_cache(op, "v_cache", v_cache, hkv, page, d, KV_CACHE_DTYPES)
    check_query(op, "q", q, tokens, None, d)
    hq = q.shape[1]
    if hq % hkv:
        raise ValueError(f"{op}: q heads ({hq}) must be a multiple of the KV heads ({hkv})")
    fp8 = torch.float8_e4m3fn
    if (k_cache.dtype == fp8) != (v_cache.dtype == fp8):
        raise ValueError(f"{op}: k_cache and v_cache must both be float8_e4m3fn or both not, got {k_cache.dtype} "
                         f"and {v_cache.dtype}")
    if k_cache.dtype != fp8 and not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"{op}: q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"{op}: k_cache and v_cache must have the same number of pages")
    if not (q.device == k_cache.device == v_cache.device):
        raise ValueError(f"{op}: q, k_cache and v_cache must be on one device")
    check_kv_scales(op, k_cache, v_cache, k_scale, v_scale)
    return hq, hkv, page, d


def check_kv_scales(op: str, k_cache, v_cache, k_scale, v_scale, contiguous: bool = False) -> bool:
    """Whether the K/V caches are float8_e4m3fn (True) or not (False), checking what goes with them: fp8 caches
    need fp32 ``k_scale``/``v_scale [P, Hkv, B]`` on the caches' device with a unit stride on the last dim
    (wholly contiguous with ``contiguous``), other caches take none, and K and V share a dtype. One line naming
    the fix otherwise; shapes, dtypes and devices only: no host sync. The one FP8 scale check of the ops, the
    references and the engine's cache-write kernel."""
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if (v_cache.dtype == torch.float8_e4m3fn) != fp8:
        raise ValueError(f"{op}: K and V caches must both be float8_e4m3fn or neither, got {k_cache.dtype} and "
                         f"{v_cache.dtype}; quantise both (kernels._common.fp8.quantize_rows)")
    given = (k_scale is not None, v_scale is not None)
    if fp8 and given != (True, True):
        raise ValueError(f"{op}: float8_e4m3fn K/V caches need k_scale and v_scale (fp32 [num_pages, Hkv, B], "
                         "kernels._common.fp8.quantize_rows); pass both")
    if not fp8 and any(given):
        raise ValueError(f"{op}: k_scale/v_scale go with float8_e4m3fn K/V caches only, the caches are "
                         f"{k_cache.dtype}; drop the scales or pass fp8 caches")
    if not fp8:
        return False
    want = tuple(k_cache.shape[:3])
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or tuple(scale.shape) != want:
            got = f"{scale.dtype} {tuple(scale.shape)}" if isinstance(scale, torch.Tensor) else type(scale).__name__
            raise ValueError(f"{op}: {name} must be fp32 [num_pages, Hkv, B] = {want}, got {got}")
        if scale.stride(2) != 1 or (contiguous and not scale.is_contiguous()):
            need = "to be contiguous" if contiguous else "a unit stride on its last dim"
            raise ValueError(f"{op}: {name} needs {need}; pass {name}.contiguous()")
        if scale.device != k_cache.device:
            raise ValueError(f"{op}: {name} is on {scale.device}, the caches on {k_cache.device}")
    return True


def check_index_scale(op: str, k_idx_cache, k_idx_scale) -> bool:
    """fp8 and int8 index keys come with their fp32 per-token scales ``[pages, B]`` (contiguous rows, on the keys'
    device) and no other keys do; returns whether the keys are scaled."""
    name = str(k_idx_cache.dtype).replace("torch.", "")
    scaled = k_idx_cache.dtype in SCALED_INDEX_KEYS
    if scaled and k_idx_scale is None:
        raise ValueError(f"{op}: {name} index keys need k_idx_scale (fp32 [pages, B], the second output of "
                         "kernels.decode.quantize_index_keys / quantize_int8_rows)")
    if not scaled and k_idx_scale is not None:
        raise ValueError(f"{op}: k_idx_scale goes with a float8_e4m3fn or int8 k_idx_cache, got a {name} one: "
                         "drop k_idx_scale or pass the quantised keys")
    if not scaled:
        return False
    check_tensor(op, "k_idx_scale", k_idx_scale, ndim=2, dtypes=(torch.float32,), device=k_idx_cache.device)
    if tuple(k_idx_scale.shape) != tuple(k_idx_cache.shape[:2]) or k_idx_scale.stride(1) != 1:
        raise ValueError(f"{op}: k_idx_scale must be [pages, B] = {tuple(k_idx_cache.shape[:2])} like k_idx_cache "
                         f"with contiguous rows, got {tuple(k_idx_scale.shape)} (strides {k_idx_scale.stride()})")
    return True


def check_index_tensors(op: str, q_idx, k_idx_cache, k_idx_scale, tokens: int, topk: int) -> tuple[int, int, int]:
    """q_idx ``[T, H, d_idx]``, k_idx_cache ``[P, B, d_idx]`` (+ scale ``[P, B]`` for fp8 / int8 keys); returns
    (H, B, d_idx)."""
    if k_idx_cache.dim() != 3:
        raise ValueError(f"{op}: k_idx_cache must be [num_pages, B, d_idx], got shape {tuple(k_idx_cache.shape)}")
    if k_idx_cache.dtype not in INDEX_KEY_DTYPES:
        raise ValueError(f"{op}: k_idx_cache dtype must be bf16, fp16, fp32, float8_e4m3fn or int8, got "
                         f"{k_idx_cache.dtype}")
    if k_idx_cache.stride(2) != 1:
        raise ValueError(f"{op}: k_idx_cache last dim must be contiguous")
    _, page, d_idx = k_idx_cache.shape
    check_query(op, "q_idx", q_idx, tokens, None, d_idx)
    scaled = check_index_scale(op, k_idx_cache, k_idx_scale)
    if not scaled and q_idx.dtype != k_idx_cache.dtype:
        raise ValueError(f"{op}: q_idx and k_idx_cache must share one dtype, got {q_idx.dtype} and "
                         f"{k_idx_cache.dtype}")
    if q_idx.device != k_idx_cache.device:
        raise ValueError(f"{op}: q_idx and k_idx_cache must be on one device")
    if not 2 <= topk <= 64:
        raise ValueError(f"{op}: topk must be in 2..64 (the local page plus at least one history page), got {topk}")
    return q_idx.shape[1], page, d_idx


# -- top-k ids ----------------------------------------------------------------------------------------

def check_topk_shape(op: str, topk_ids: torch.Tensor, tokens: int, hkv: int) -> int:
    """Decode top-k ids int32 ``[T, Hkv, k]`` token-major with a contiguous last dim; returns k."""
    if topk_ids.dtype != torch.int32 or topk_ids.dim() != 3:
        raise ValueError(f"{op}: topk_ids must be int32 [T, Hkv, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_ids.shape[0] != tokens or topk_ids.shape[1] != hkv:
        raise ValueError(f"{op}: topk_ids must be [T={tokens}, Hkv={hkv}, k] (token-major), got "
                         f"{tuple(topk_ids.shape)}")
    if topk_ids.stride(2) != 1:
        raise ValueError(f"{op}: topk_ids last dim must be contiguous")
    return topk_ids.shape[2]


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
