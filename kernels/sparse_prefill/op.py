"""Public MSA sparse prefill attention op: validation, design choice and launch."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from kernels._common.tiles import tile_table, token_requests
from kernels._common.validate import (check_choice, check_lengths, check_size, check_tensor,
                                      check_topk_ids, interpreting, resolve_impl)
from kernels.sparse_prefill import naive

OP = "msa_prefill_attention"
TOPK_CHOICES = (4, 8, 16, 32)
BLOCK_CHOICES = (64, 128)
HEAD_DIM_CHOICES = (64, 128)
TILE_Q_CHOICES = (1, 2, 4, 8, 16, 32)  # powers of two: the union kernel's id tile is tile_q * k
_INT_MAX = torch.iinfo(torch.int32).max


def _validate(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, impl, check_ids):
    check_tensor(OP, "q", q, ndim=3, dtypes=(torch.bfloat16, torch.float16, torch.float32))
    impl = resolve_impl(impl, q.device, OP)
    if impl == "triton" and q.dtype == torch.float32:
        raise ValueError(f"{OP}: the Triton kernel takes bfloat16 or float16 q, got float32; use impl='torch'")
    dev = q.device
    check_tensor(OP, "k_cache", k_cache, ndim=4, dtypes=(q.dtype,), device=dev)
    check_tensor(OP, "v_cache", v_cache, ndim=4, dtypes=(q.dtype,), device=dev)
    check_tensor(OP, "page_table", page_table, ndim=2, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "seq_lens_kv", seq_lens_kv, ndim=1, dtypes=(torch.int32,), device=dev)
    check_tensor(OP, "topk_ids", topk_ids, ndim=3, dtypes=(torch.int32,), device=dev)
    t, hq, d = q.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"{OP}: v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    _, hkv, block, dk = k_cache.shape
    check_size(OP, "k_cache", dk, d, "head dim (q's last dim)")
    check_choice(OP, "head dim", d, HEAD_DIM_CHOICES)
    check_choice(OP, "block size (k_cache dim 2)", block, BLOCK_CHOICES)
    if hkv < 1 or hq % hkv or not 1 <= hq // hkv <= 16:
        raise ValueError(f"{OP}: query heads must be a multiple 1..16 of KV heads, got Hq={hq}, Hkv={hkv}")
    check_size(OP, "topk_ids", topk_ids.shape[0], t, "dim 0 (tokens)")
    check_size(OP, "topk_ids", topk_ids.shape[1], hkv, "dim 1 (KV heads)")
    check_choice(OP, "topk (topk_ids dim 2)", topk_ids.shape[2], TOPK_CHOICES)
    check_lengths(OP, cu_seqlens_q, seq_lens_kv, t, page_table, block)
    if check_ids:
        check_topk_ids(OP, topk_ids, cu_seqlens_q, seq_lens_kv, block)
    return impl


def msa_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          page_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seq_lens_kv: torch.Tensor,
                          topk_ids: torch.Tensor, *, scale: float | None = None,
                          impl: Literal["auto", "triton", "torch"] = "auto",
                          design: Literal["auto", "tile", "token"] = "auto", tile_q: int | None = None,
                          check_ids: bool = True, out: torch.Tensor | None = None,
                          lse: torch.Tensor | None = None, rare_max: int | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention of packed queries over their selected blocks in the paged KV cache.

    q ``[T, Hq, d]``, k_cache / v_cache ``[pages, Hkv, B, d]``, page_table int32 ``[R, max_pages]``,
    cu_seqlens_q int32 ``[R+1]``, seq_lens_kv int32 ``[R]`` (including this chunk), topk_ids int32
    ``[T, Hkv, k]`` logical block ids (valid prefix, -1 padding). Returns ``out [T, Hq, d]`` in q's
    dtype and ``lse [T, Hq]`` fp32 (natural log; -inf and zero output for an empty selection).

    ``design`` picks the Triton kernel: ``tile`` shares K/V pages among ``tile_q`` neighbouring
    tokens, ``token`` runs one program per token (the simple fallback); ``auto`` builds the tile
    unions and picks ``tile`` unless the mean union is past the measured break-even
    (``prefer_tile``; one host sync).
    ``rare_max`` (tile design): blocks selected by at most this many of a tile's tokens are left out
    of the tile's shared loop and added per token by a second pass (``None``: ``default_rare_max``;
    0: off).
    ``check_ids`` validates the ids on the device (one host sync; timing runs turn it off).
    ``out`` / ``lse``: optional preallocated outputs of those shapes (q's dtype / fp32, contiguous);
    the kernels write every element (the tests pass NaN-poisoned buffers to prove it).
    """
    impl = _validate(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, impl, check_ids)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    t, hq, d = q.shape
    if impl == "torch":
        ref_out, ref_lse = naive.sparse_attention_reference(q, k_cache, v_cache, page_table, cu_seqlens_q,
                                                            seq_lens_kv, topk_ids, scale)
        if out is not None:
            ref_out = _output(out, (t, hq, d), q.dtype, q.device, "out").copy_(ref_out)
        if lse is not None:
            ref_lse = _output(lse, (t, hq), torch.float32, q.device, "lse").copy_(ref_lse)
        return ref_out, ref_lse
    if design not in ("auto", "tile", "token"):
        raise ValueError(f"{OP}: design must be 'auto', 'tile' or 'token', got {design!r}")
    out = _output(out, (t, hq, d), q.dtype, q.device, "out")
    lse = _output(lse, (t, hq), torch.float32, q.device, "lse")
    if t == 0:
        return out, lse
    group = hq // k_cache.shape[1]
    tile_q = tile_q or default_tile_q(group)
    if tile_q not in TILE_Q_CHOICES:
        raise ValueError(f"{OP}: tile_q must be one of {TILE_Q_CHOICES}, got {tile_q}")
    rare_max = default_rare_max(group) if rare_max is None else int(rare_max)
    if not 0 <= rare_max < tile_q:
        raise ValueError(f"{OP}: rare_max must be in 0..tile_q-1 = 0..{tile_q - 1}, got {rare_max}")
    tiles = tile_table(cu_seqlens_q, t, tile_q, longest_first=False)
    union = None
    if design != "token":
        union = build_unions(topk_ids, page_table, cu_seqlens_q, *tiles, tile_q, rare_max=rare_max)
    if design == "auto":  # one host sync: the mean union decides which kernel is faster
        valid = tiles[0] >= 0
        work = (union.count * valid[:, None]).sum()  # no boolean indexing: .item() is the only sync
        if union.rare_ids is not None:  # rare (token, block) pairs: 1/tile_q of a union block each
            work = work + (union.rare_ids >= 0).sum() / tile_q
        mean_union = (work / (valid.sum() * k_cache.shape[1]).clamp(min=1)).item()
        design = "tile" if prefer_tile(mean_union, topk_ids.shape[2], tile_q, group) else "token"
    if design == "token":
        _launch_token(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale)
    else:
        _launch_tile(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
                     tile_q, tiles=tiles, union=union)
    return out, lse


def _output(buf, shape, dtype, device, name):
    if buf is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != device or not buf.is_contiguous():
        raise ValueError(f"{OP}: {name} must be a contiguous {dtype} tensor of shape {shape} on {device}, "
                         f"got {buf.dtype} {tuple(buf.shape)} on {buf.device}")
    return buf


# Break-even measured on an H200 (M3 shape, G = 16, TQ = 8, bf16, benchmarks/prefill/RESULTS.md run 2):
# the tile kernel costs about 0.65 ms per union block per 64K tokens (16.8 ms at union 25.0), the
# per-token kernel 31.3 ms, so it wins below a union of ~3 k; per row of MMA work the 128-row tile
# is ~3x as efficient as the 16-row per-token tile (2.4x before the run-2 tile kernel).
_TILE_EFFICIENCY = 3.0


def prefer_tile(mean_union: float, topk: int, tile_q: int, group: int) -> bool:
    """Tile sharing wins when its MMA rows x union beat the per-token kernel's padded rows x k.

    Tile work ~ ``union * BLOCK_M``; per-token work ~ ``tile_q * k * GP`` (GP = G padded to >= 16),
    scaled by the measured efficiency ratio of the two kernels.
    """
    block_m = max(16, triton_next_pow2(tile_q * group))
    rows_per_token = max(16, triton_next_pow2(group))
    return mean_union * block_m <= _TILE_EFFICIENCY * tile_q * topk * rows_per_token


def default_rare_max(group: int) -> int:
    """Blocks selected by at most this many tokens of a tile go to the per-token pass (0: none).

    2 for G >= 8 (measured on the H200, M3 shape, 8-token tiles: union 27 -> 18 blocks, 7-9% faster
    than no split, benchmarks/prefill/RESULTS.md session 2 run 4); small groups are not measured: off.
    """
    return 2 if group >= 8 else 0


def default_tile_stages(block_m: int) -> int:
    """Pipeline stages of the tile kernel: 3 at 128 rows (run 4: 36.0 vs 36.8 ms at 128K), else 2."""
    return 3 if block_m >= 128 else 2


def default_tile_q(group: int) -> int:
    """Tokens per tile: 8 x G rows for G >= 8 (128 rows at G = 16), 16 tokens for small groups."""
    return 8 if group >= 8 else 16


def _strides(q, k_cache, v_cache, page_table, topk_ids, out):
    return (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0),
            topk_ids.stride(0), topk_ids.stride(1), out.stride(0), out.stride(1))


def _launch_token(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
                  merge=False):
    """One program per (token, KV head). ``merge``: add ``topk_ids``' blocks to the attention state
    already in ``out``/``lse`` (rows with no ids are left as they are)."""
    from kernels.sparse_prefill.triton_sparse_attention import _token_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    tok_req = token_requests(cu_seqlens_q, t)
    _token_kernel[(t * hkv,)](
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, tok_req, topk_ids, out, lse,
        *_strides(q, k_cache, v_cache, page_table, topk_ids, out), scale * 1.4426950408889634,
        HKV=hkv, G=group, GP=max(16, triton_next_pow2(group)), D=d, B=block, TOPK=topk_ids.shape[2],
        UPCAST=interpreting(), MERGE=merge, num_warps=4, num_stages=2)


def tile_unions(topk_ids: torch.Tensor, tile_req: torch.Tensor, tile_start: torch.Tensor,
                cu_seqlens_q: torch.Tensor, tile_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of the tile unions: sorted, de-duplicated selected blocks per (tile, KV head).

    Returns ``union`` int32 ``[tiles, Hkv, tile_q * k]`` (ascending ids, then -1) and ``count``
    int32 ``[tiles, Hkv]``. Two segmented sorts; the kernels use ``build_unions`` (one Triton launch).
    """
    t, hkv, k = topk_ids.shape
    tok = tile_start.long()[:, None] + torch.arange(tile_q, device=topk_ids.device)
    q_end = cu_seqlens_q.long()[tile_req.long().clamp(min=0) + 1]
    ok = (tile_req >= 0)[:, None] & (tok < q_end[:, None])
    ids = topk_ids[tok.clamp(max=t - 1)]  # [tiles, tq, Hkv, k]
    ids = torch.where(ok[:, :, None, None] & (ids >= 0), ids, _INT_MAX)
    ids = ids.permute(0, 2, 1, 3).reshape(-1, hkv, tile_q * k)
    ids = torch.sort(ids, dim=-1).values
    dup = torch.zeros_like(ids, dtype=torch.bool)
    dup[..., 1:] = ids[..., 1:] == ids[..., :-1]
    ids = torch.sort(torch.where(dup, _INT_MAX, ids), dim=-1).values
    count = (ids != _INT_MAX).sum(-1, dtype=torch.int32)
    return torch.where(ids == _INT_MAX, -1, ids).contiguous(), count.contiguous()


@dataclass
class TileUnions:
    """What ``build_unions`` returns; unpacks as ``(union, pages, count)`` like before.

    union / pages / token_mask int32 ``[tiles, Hkv, tile_q * k]`` (ids in order of first
    appearance, then -1 / page 0 / mask 0), count int32 ``[tiles, Hkv]``; rare_ids int32
    ``[T, Hkv, k]`` (each token's blocks left out of its tile's union, -1 after) or None.
    """
    union: torch.Tensor
    pages: torch.Tensor
    token_mask: torch.Tensor
    count: torch.Tensor
    rare_ids: torch.Tensor | None

    def __iter__(self):
        return iter((self.union, self.pages, self.count))


def build_unions(topk_ids: torch.Tensor, page_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 tile_req: torch.Tensor, tile_start: torch.Tensor, tile_q: int, rare_max: int = 0) -> TileUnions:
    """Union of the selected blocks of each (tile, KV head), one Triton launch, no host sync.

    Distinct logical ids in order of first appearance, their physical pages and the bitmask of the
    tile's tokens that selected each (bit j: token ``tile_start + j``). ``rare_max > 0``: blocks
    selected by at most ``rare_max`` tokens of the tile are left out and listed per token in
    ``rare_ids`` instead. ``tile_q`` must be a power of two up to 32.
    """
    from kernels.sparse_prefill.triton_sparse_attention import _union_kernel

    t, hkv, k = topk_ids.shape
    n_tiles = tile_req.shape[0]
    dev = topk_ids.device
    union = torch.empty((n_tiles, hkv, tile_q * k), dtype=torch.int32, device=dev)
    pages = torch.empty_like(union)
    token_mask = torch.empty_like(union)
    count = torch.empty((n_tiles, hkv), dtype=torch.int32, device=dev)
    rare = torch.empty((t, hkv, k), dtype=torch.int32, device=dev) if rare_max > 0 else None
    rare_arg = rare if rare is not None else count
    _union_kernel[(n_tiles * hkv,)](
        topk_ids, page_table, cu_seqlens_q, tile_req, tile_start, union, pages, token_mask, count, rare_arg,
        topk_ids.stride(0), topk_ids.stride(1), page_table.stride(0), union.stride(0), union.stride(1),
        rare.stride(0) if rare is not None else 0, rare.stride(1) if rare is not None else 0,
        HKV=hkv, TQ=tile_q, TOPK=k, RARE_MAX=rare_max, num_warps=4)
    return TileUnions(union, pages, token_mask, count, rare)


def _launch_tile(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale, tile_q,
                 num_warps=None, num_stages=None, tiles=None, union=None, rare_max=0):
    """Tile kernel over each tile's union; then, if the union left rare blocks out, the per-token
    kernel adds them (``merge``)."""
    from kernels.sparse_prefill.triton_sparse_attention import _tile_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    tile_req, tile_start = tiles or tile_table(cu_seqlens_q, t, tile_q, longest_first=False)
    if union is None:
        union = build_unions(topk_ids, page_table, cu_seqlens_q, tile_req, tile_start, tile_q, rare_max=rare_max)
    block_m = max(16, triton_next_pow2(tile_q * group))
    _tile_kernel[(tile_req.shape[0] * hkv,)](
        q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, tile_req, tile_start,
        union.union, union.pages, union.token_mask, union.count, out, lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), union.union.stride(0), union.union.stride(1), scale * 1.4426950408889634,
        HKV=hkv, G=group, TQ=tile_q, BLOCK_M=block_m, D=d, B=block,
        UPCAST=interpreting(), num_warps=num_warps or (8 if block_m >= 128 else 4),
        num_stages=num_stages or default_tile_stages(block_m))
    if union.rare_ids is not None:
        _launch_token(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union.rare_ids, out, lse, scale,
                      merge=True)


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
