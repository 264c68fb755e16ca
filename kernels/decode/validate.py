"""Input checks for the decode ops. Each failure is one ValueError line naming the rule broken.

Split in two: ``check_metadata`` reads ``seq_lens`` values (a host sync, done in ``plan()`` and by
the plain functions, never inside a CUDA graph capture); the ``check_*_tensors`` helpers look only at
shapes, dtypes, strides and devices, so ``run()`` can call them while capturing.
"""
from __future__ import annotations

import torch

MAX_Q_LEN = 16
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_KEY_DTYPES = FLOAT_DTYPES + (torch.float8_e4m3fn,)


def _fail(msg: str) -> None:
    raise ValueError(msg)


def check_q_len(q_len: int) -> None:
    if not isinstance(q_len, int) or not 1 <= q_len <= MAX_Q_LEN:
        _fail(f"q_len must be an int in 1..{MAX_Q_LEN} (1 main token + drafts), got {q_len!r}")


def check_metadata_shapes(seq_lens: torch.Tensor, page_table: torch.Tensor, q_len: int) -> None:
    """Shapes and dtypes of the request metadata (no host sync)."""
    check_q_len(q_len)
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1:
        _fail(f"seq_lens must be int32 [R], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if page_table.dtype != torch.int32 or page_table.dim() != 2:
        _fail(f"page_table must be int32 [R, max_pages], got {page_table.dtype} {tuple(page_table.shape)}")
    if page_table.shape[0] != seq_lens.shape[0]:
        _fail(f"page_table has {page_table.shape[0]} rows but seq_lens has {seq_lens.shape[0]} requests")
    if seq_lens.shape[0] == 0:
        _fail("seq_lens is empty: a decode batch needs at least one request")
    if page_table.stride(1) != 1:
        _fail("page_table rows must be contiguous (stride(1) == 1); pass page_table.contiguous()")
    if seq_lens.device != page_table.device:
        _fail(f"seq_lens is on {seq_lens.device} but page_table is on {page_table.device}")


def check_metadata_values(
    seq_lens: torch.Tensor, page_table: torch.Tensor, q_len: int, page_size: int, num_pages: int | None = None
) -> None:
    """Value checks (host sync): ``q_len <= seq_len <= max_pages * B`` and, given num_pages,
    every page a request uses is a valid physical page."""
    check_metadata_shapes(seq_lens, page_table, q_len)
    lens = seq_lens.cpu()
    capacity = page_table.shape[1] * page_size
    if int(lens.min()) < q_len:
        _fail(f"every seq_len must be >= q_len={q_len} (seq_lens include the new tokens), got min {int(lens.min())}")
    if int(lens.max()) > capacity:
        _fail(
            f"seq_len {int(lens.max())} exceeds the page-table capacity max_pages*B = "
            f"{page_table.shape[1]}*{page_size} = {capacity}; widen page_table"
        )
    if num_pages is not None:
        used = (lens + page_size - 1) // page_size
        cols = torch.arange(page_table.shape[1])[None, :] < used[:, None]
        pages = page_table.cpu()[cols]
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
            _fail(f"page_table holds page ids outside [0, {num_pages}) for pages the requests use")


def check_cache(name: str, cache: torch.Tensor, num_kv_heads: int | None, page_size: int | None, head_dim: int | None):
    """``[P, Hkv, B, d]`` paged K or V cache with a contiguous last dim."""
    if cache.dim() != 4:
        _fail(f"{name} must be [num_pages, Hkv, B, d], got shape {tuple(cache.shape)}")
    if cache.dtype not in FLOAT_DTYPES:
        _fail(f"{name} dtype must be bf16, fp16 or fp32, got {cache.dtype}")
    if cache.stride(3) != 1:
        _fail(f"{name} last dim must be contiguous")
    got = (cache.shape[1], cache.shape[2], cache.shape[3])
    want = (num_kv_heads, page_size, head_dim)
    for g, w, what in zip(got, want, ("Hkv", "B", "d")):
        if w is not None and g != w:
            _fail(f"{name} {what} is {g}, expected {w} (shape [num_pages, Hkv, B, d])")


def check_query(name: str, q: torch.Tensor, tokens: int, heads: int | None, dim: int | None, dtypes=FLOAT_DTYPES):
    """``[T, H, d]`` queries with a contiguous last dim."""
    if q.dim() != 3:
        _fail(f"{name} must be [R*q_len, H, d], got shape {tuple(q.shape)}")
    if q.dtype not in dtypes:
        _fail(f"{name} dtype must be one of {[str(d) for d in dtypes]}, got {q.dtype}")
    if q.shape[0] != tokens:
        _fail(f"{name} has {q.shape[0]} tokens, expected R*q_len = {tokens}")
    if heads is not None and q.shape[1] != heads:
        _fail(f"{name} has {q.shape[1]} heads, expected {heads}")
    if dim is not None and q.shape[2] != dim:
        _fail(f"{name} head dim is {q.shape[2]}, expected {dim}")
    if q.stride(2) != 1:
        _fail(f"{name} last dim must be contiguous")


def check_attention_tensors(q, k_cache, v_cache, tokens: int) -> tuple[int, int, int, int]:
    """Checks q ``[T, Hq, d]`` against the caches; returns (Hq, Hkv, B, d)."""
    check_cache("k_cache", k_cache, None, None, None)
    _, hkv, page, d = k_cache.shape
    check_cache("v_cache", v_cache, hkv, page, d)
    check_query("q", q, tokens, None, d)
    hq = q.shape[1]
    if hq % hkv:
        _fail(f"q heads ({hq}) must be a multiple of the KV heads ({hkv})")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        _fail(f"q, k_cache and v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if v_cache.shape[0] != k_cache.shape[0]:
        _fail("k_cache and v_cache must have the same number of pages")
    if not (q.device == k_cache.device == v_cache.device):
        _fail("q, k_cache and v_cache must be on one device")
    return hq, hkv, page, d


def check_topk_ids(topk_ids: torch.Tensor, tokens: int, hkv: int) -> int:
    if topk_ids.dtype != torch.int32 or topk_ids.dim() != 3:
        _fail(f"topk_ids must be int32 [T, Hkv, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_ids.shape[0] != tokens or topk_ids.shape[1] != hkv:
        _fail(f"topk_ids must be [T={tokens}, Hkv={hkv}, k] (token-major), got {tuple(topk_ids.shape)}")
    if topk_ids.stride(2) != 1:
        _fail("topk_ids last dim must be contiguous")
    return topk_ids.shape[2]


def check_index_tensors(q_idx, k_idx_cache, k_idx_scale, tokens: int, topk: int) -> tuple[int, int, int]:
    """q_idx ``[T, H, d_idx]``, k_idx_cache ``[P, B, d_idx]`` (+ scale ``[P, B]`` for fp8); returns (H, B, d_idx)."""
    if k_idx_cache.dim() != 3:
        _fail(f"k_idx_cache must be [num_pages, B, d_idx], got shape {tuple(k_idx_cache.shape)}")
    if k_idx_cache.dtype not in INDEX_KEY_DTYPES:
        _fail(f"k_idx_cache dtype must be bf16, fp16, fp32 or float8_e4m3fn, got {k_idx_cache.dtype}")
    if k_idx_cache.stride(2) != 1:
        _fail("k_idx_cache last dim must be contiguous")
    _, page, d_idx = k_idx_cache.shape
    check_query("q_idx", q_idx, tokens, None, d_idx)
    is_fp8 = k_idx_cache.dtype == torch.float8_e4m3fn
    if is_fp8 != (k_idx_scale is not None):
        _fail("k_idx_scale ([num_pages, B] fp32) is required with float8_e4m3fn index keys and only then")
    if is_fp8 and (
        k_idx_scale.dtype != torch.float32
        or tuple(k_idx_scale.shape) != tuple(k_idx_cache.shape[:2])
        or k_idx_scale.stride(1) != 1
    ):
        _fail(f"k_idx_scale must be fp32 [num_pages, B] = {tuple(k_idx_cache.shape[:2])} with contiguous rows")
    if not is_fp8 and q_idx.dtype != k_idx_cache.dtype:
        _fail(f"q_idx and k_idx_cache must share one dtype, got {q_idx.dtype} and {k_idx_cache.dtype}")
    if q_idx.device != k_idx_cache.device:
        _fail("q_idx and k_idx_cache must be on one device")
    if not 2 <= topk <= 64:
        _fail(f"topk must be in 2..64 (the local page plus at least one history page), got {topk}")
    return q_idx.shape[1], page, d_idx
