"""The one place that decides how a sparse prefill call runs: ``plan_prefill(shape, device, ...) -> PrefillPlan``.

From the inputs' sizes, dtype and contiguity (``PrefillShape``), the device (``DeviceInfo``) and the
caller's overrides (``TileConfig``) it picks the kernel, the rare-block pass, the tile and step sizes,
warps, stages and persistent grids; the launchers (``launch.py``) run the plan and decide nothing.
The defaults are what measured fastest on an H200 (M3 shape, real selections; the current numbers
in ``benchmarks/kernels/RESULTS.md``, what lost in ``benchmarks/CHANGELOG.md``).

| where | tile kernel | rare pass |
| --- | --- | --- |
| sm_90 + Gluon, ``tile_q x G = 128``, contiguous caches | Gluon (``gluon_tile.py``) | items (G 8 or 16) or token |
| any other CUDA GPU or shape, or the interpreter | Triton (``triton_sparse_attention._tile_kernel``) | token |
| ``design="token"`` | per-token kernel, no unions | - |
| ``impl="torch"`` | ``naive.py`` | - |

FP8 (e4m3) K/V (``PrefillShape.kv_dtype``): the same table, except that sm_90 takes the Gluon tile kernel by
default only if ``fp8_prefill_uses_gluon()`` says so (the one switch; otherwise the Triton tile kernel's
``FP8`` mode, and ``TileConfig(kernel="gluon")`` asks for Gluon explicitly).

``design="auto"`` plans the tile design and, once the unions are built, runs the per-token kernel
instead when their mean size is past the measured break-even (``tile_wins``; one host sync).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._common.device import DeviceInfo
from kernels._common.fp8 import FP8
from kernels.sparse_prefill.rare_items import max_rare_items

OP = "msa_prefill_attention"
DESIGNS = ("auto", "tile", "token")
KERNELS = ("triton", "gluon")
RARE_PASSES = ("token", "items")
TILE_Q_CHOICES = (1, 2, 4, 8, 16, 32)  # powers of two: the union kernel's id tile is tile_q * k
SMEM_BYTES = 232448 - 1024  # sm_90's shared memory per block, less the barriers and the compiler's scratch
# per row of MMA work the 128-row tile is ~3x as efficient as the 16-row per-token tile (H200, M3 shape):
# the tile kernel cost 0.65 ms per union block per 64K tokens, the per-token kernel 31.3 ms
TILE_EFFICIENCY = 3.0


@dataclass(frozen=True)
class TileConfig:
    """Overrides of the tile design's plan; ``None``: the plan's default for the shape and device."""
    tile_q: int | None = None  # tokens per tile (a power of two up to 32); 8 for G >= 8, else 16
    rare_max: int | None = None  # blocks chosen by at most this many of a tile's tokens go to the rare pass
    kernel: str | None = None  # tile kernel: "gluon" (sm_90) or "triton"
    rare_pass: str | None = None  # "items" (Gluon kernel only) or "token"
    group: bool | None = None  # regroup each 128-token window's tiles by shared selections (on at 128 rows)
    num_warps: int | None = None  # Triton tile kernel's warps: 8 at 128 rows, else 4
    num_stages: int | None = None  # tile kernel's K / V pipeline stages: Gluon 2, Triton 3 at 128 rows, else 2
    block_n: int | None = None  # keys per loop step (0: the whole block); Triton 64 at 128 rows
    rare_block_n: int | None = None  # keys per step of the token rare pass (0: the whole block)
    maxnreg: int | None = None  # Triton tile kernel's register cap on Hopper and newer (0: none); 128 at 128 rows
    tma: bool | None = None  # Triton tile kernel's K / V through tensor descriptors (Hopper, contiguous caches)


@dataclass(frozen=True)
class PrefillShape:
    """What the plan reads of the inputs: sizes, element size and contiguity."""
    tokens: int
    requests: int
    pages: int  # page_table entries: requests x max_pages
    q_heads: int
    kv_heads: int
    head_dim: int
    block: int
    topk: int
    elem_bytes: int = 2
    q_contiguous: bool = True
    kv_contiguous: bool = True
    kv_dtype: torch.dtype = torch.bfloat16  # the K/V caches' dtype; float8_e4m3fn: the Q8KV8 kernels

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def fp8(self) -> bool:
        return self.kv_dtype == FP8

    @classmethod
    def of(cls, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
           topk_ids: torch.Tensor) -> PrefillShape:
        t, hq, d = q.shape
        return cls(tokens=t, requests=page_table.shape[0], pages=page_table.numel(), q_heads=hq,
                   kv_heads=k_cache.shape[1], head_dim=d, block=k_cache.shape[2], topk=topk_ids.shape[2],
                   elem_bytes=q.element_size(), q_contiguous=q.is_contiguous(),
                   kv_contiguous=k_cache.is_contiguous() and v_cache.is_contiguous(), kv_dtype=k_cache.dtype)


@dataclass(frozen=True)
class PrefillPlan:
    """How one call runs. ``kernel``: "gluon" / "triton" (tile design), "token" (per-token kernel) or
    "torch" (the reference); ``auto``: the per-token kernel instead if ``tile_wins`` says so once the
    unions are built. The tile fields: ``tile_q`` tokens per tile, ``block_m`` MMA rows, ``rare_max``
    and ``rare_pass`` (None: no rare split), ``group`` (regrouped tiles), ``block_n`` keys per step
    (0: whole blocks), ``num_warps`` / ``num_stages`` / ``maxnreg`` / ``tma`` of the Triton tile kernel,
    ``q_tma`` (Gluon: Q copied by the producer and out stored by TMA, else both by the consumers),
    ``programs`` / ``rare_programs`` (Gluon's persistent grids), ``rare_warps`` / ``rare_block_n`` /
    ``rare_stages`` (the token rare pass)."""
    kernel: str
    auto: bool = False
    tile_q: int = 8
    block_m: int = 128
    rare_max: int = 0
    rare_pass: str | None = None
    group: bool = False
    block_n: int = 0
    num_warps: int = 4
    num_stages: int = 2
    maxnreg: int = 0
    tma: bool = False
    q_tma: bool = False
    programs: int = 1
    rare_programs: int = 1
    rare_warps: int = 4
    rare_block_n: int = 0
    rare_stages: int = 2


def fp8_prefill_uses_gluon() -> bool:
    """Whether FP8 K/V takes the Gluon tile kernel (and its items rare pass) by default where the Gluon
    kernel runs (sm_90, 128-row tiles, contiguous caches), rather than the Triton tile kernel's FP8 mode.

    The one decision point of the FP8 kernel choice. True: on an H200 (torch 2.11, Triton 3.6; M3 shape,
    top-16) the Gluon FP8 kernel passed its tests and took 32.7 ms at 128K and 287 ms at 1M against the
    Triton tile kernel's 95.1 / 895 ms (``benchmarks/kernels/prefill.py --preset fp8 --fp8-impl
    triton,gluon``, 2026-12-04). Both are slower than the bf16 Gluon kernel (21.4 / 198 ms): see the
    kernel README.
    An explicit ``TileConfig(kernel="triton")`` runs the Triton tile kernel whatever this says.
    """
    return True


def pow2(n: int) -> int:
    """The next power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def tile_block_m(tile_q: int, group: int) -> int:
    """MMA rows of one tile program: ``tile_q x G`` padded to a power of two >= 16."""
    return max(16, pow2(tile_q * group))


def plan_prefill(shape: PrefillShape, device: DeviceInfo, *, impl: str = "triton", design: str = "auto",
                 config: TileConfig | None = None) -> PrefillPlan:
    """The plan of one call (``impl`` already resolved to "triton" or "torch"); a ``ValueError`` naming
    the fix for an option that cannot run here."""
    if design not in DESIGNS:
        raise ValueError(f"{OP}: design must be 'auto', 'tile' or 'token', got {design!r}")
    if impl == "torch":
        return PrefillPlan(kernel="torch")
    cfg = config or TileConfig()
    _check_values(cfg, shape.block)
    group = shape.group
    tile_q = cfg.tile_q or (8 if group >= 8 else 16)
    if tile_q not in TILE_Q_CHOICES:
        raise ValueError(f"{OP}: tile_q must be one of {TILE_Q_CHOICES}, got {tile_q}")
    if design == "token":
        if cfg.rare_max is not None:
            _check_rare_max(cfg.rare_max, tile_q)
        return PrefillPlan(kernel="token", tile_q=tile_q)
    block_m = tile_block_m(tile_q, group)
    wide = block_m >= 128
    kernel = cfg.kernel
    limit = _gluon_limit(shape, device, tile_q)
    if kernel is None:
        kernel = "triton" if limit or (shape.fp8 and not fp8_prefill_uses_gluon()) else "gluon"
    elif kernel == "gluon" and limit:
        raise ValueError(limit)
    if kernel == "gluon":
        _check_gluon_smem(cfg, shape, tile_q)
    rare_pass = cfg.rare_pass
    items = kernel == "gluon" and _items_runs(shape, tile_q)
    if rare_pass == "items":
        if kernel != "gluon":
            raise ValueError(f"{OP}: rare_pass='items' runs in the Gluon tile kernel (kernel='gluon', Hopper); "
                             "use rare_pass='token'")
        if not items:
            raise ValueError(f"{OP}: rare_pass='items' needs contiguous q and out, a group of 8 or 16 heads and "
                             "room for two Q buffers; use rare_pass='token'")
    elif rare_pass is None:
        rare_pass = "items" if items else "token"
    # G >= 8: rare_max 2 with the items pass (its pairs share K / V), 1 with the token pass; smaller
    # groups were not measured: off
    rare_max = cfg.rare_max if cfg.rare_max is not None else 0 if group < 8 else 2 if rare_pass == "items" else 1
    _check_rare_max(rare_max, tile_q)
    plan = dict(kernel=kernel, auto=design == "auto", tile_q=tile_q, block_m=block_m, rare_max=rare_max,
                rare_pass=rare_pass if rare_max else None, group=wide if cfg.group is None else cfg.group,
                rare_warps=2 if wide else 4,
                rare_block_n=(64 if wide and shape.block > 64 else 0) if cfg.rare_block_n is None
                else cfg.rare_block_n)
    if kernel == "gluon":
        stages = cfg.num_stages or 2
        block_n = cfg.block_n or shape.block
        n_items = (-(-shape.tokens // tile_q) + shape.requests) * shape.kv_heads
        n_rare = max_rare_items(shape.tokens, shape.kv_heads, shape.topk, shape.pages, tile_q)
        return PrefillPlan(**plan, block_n=block_n, num_stages=stages, num_warps=4,
                           q_tma=_q_tma_fits(shape, tile_q, block_n, stages), programs=min(n_items, device.sms),
                           rare_programs=min(n_rare, device.sms))
    hopper = device.sm_major >= 9
    tma = cfg.tma if cfg.tma is not None else hopper and wide and shape.kv_contiguous
    if tma:
        _check_tma(shape, device)
    return PrefillPlan(**plan, block_n=(64 if wide and shape.block > 64 else 0) if cfg.block_n is None
                       else cfg.block_n, num_warps=cfg.num_warps or (8 if wide else 4),
                       num_stages=cfg.num_stages or (3 if wide else 2),
                       maxnreg=((128 if wide else 0) if cfg.maxnreg is None else cfg.maxnreg) if hopper else 0,
                       tma=tma)


def _check_values(cfg: TileConfig, block: int) -> None:
    if cfg.kernel not in (None, *KERNELS):
        raise ValueError(f"{OP}: kernel must be 'triton' or 'gluon', got {cfg.kernel!r}")
    if cfg.rare_pass not in (None, *RARE_PASSES):
        raise ValueError(f"{OP}: rare_pass must be 'token' or 'items', got {cfg.rare_pass!r}")
    for name, value in (("block_n", cfg.block_n), ("rare_block_n", cfg.rare_block_n)):
        if value and (block % value or value < 16):
            raise ValueError(f"{OP}: {name} must divide the block size {block} and be >= 16, got {value}")


def _check_rare_max(rare_max: int, tile_q: int) -> None:
    if not 0 <= rare_max < tile_q:
        raise ValueError(f"{OP}: rare_max must be in 0..tile_q-1 = 0..{tile_q - 1}, got {rare_max}")


def _gluon_limit(shape: PrefillShape, device: DeviceInfo, tile_q: int) -> str | None:
    """Why the Gluon tile kernel cannot run this shape here (the ``ValueError`` message naming the fix), or
    None: the plan then takes it by default."""
    if device.sm_major != 9 or not device.gluon:
        return f"{OP}: kernel='gluon' needs a Hopper GPU (sm_90); use kernel='triton'"
    rows = tile_q * shape.group
    if rows != 128:
        return (f"{OP}: kernel='gluon' needs 128-row tiles (tile_q x group = 128), got {rows} rows; "
                "use kernel='triton'")
    if not shape.kv_contiguous:
        return (f"{OP}: kernel='gluon' needs contiguous k_cache and v_cache ([pages, Hkv, B, d] in that order: "
                "TMA); pass .contiguous() caches or use kernel='triton'")
    return None


def _check_gluon_smem(cfg: TileConfig, shape: PrefillShape, tile_q: int) -> None:
    """The Gluon kernel's K / V ring and one Q buffer must fit in an sm_90 block's shared memory."""
    stages, block_n = cfg.num_stages or 2, cfg.block_n or shape.block
    need = (2 * stages * block_n + tile_q * shape.group) * shape.head_dim * shape.elem_bytes
    if need > SMEM_BYTES:
        raise ValueError(f"{OP}: kernel='gluon' with {stages} stages of {block_n} keys needs {need} bytes of shared "
                         f"memory, more than the {SMEM_BYTES} an H100 / H200 block has; use fewer stages or a "
                         "smaller block_n")


def _q_tma_fits(shape: PrefillShape, tile_q: int, block_n: int, stages: int) -> bool:
    """Q by the producer's TMA (and out stored by TMA): groups of 8 or 16 heads (one ``[G, d]`` box per
    token), a contiguous ``q`` and room for a second Q buffer beside the K / V ring."""
    rows = tile_q * shape.group
    need = (2 * stages * block_n + 2 * rows) * shape.head_dim * shape.elem_bytes
    return shape.group in (8, 16) and shape.q_contiguous and need <= SMEM_BYTES


def _items_runs(shape: PrefillShape, tile_q: int) -> bool:
    """The items rare pass: Gluon's rare mode with Q and out by TMA, whole blocks in 2 stages and three
    Q buffers."""
    rows = tile_q * shape.group
    need = (2 * 2 * shape.block + 3 * rows) * shape.head_dim * shape.elem_bytes
    return _q_tma_fits(shape, tile_q, shape.block, 2) and need <= SMEM_BYTES


def _check_tma(shape: PrefillShape, device: DeviceInfo) -> None:
    if not device.interpret and device.sm_major < 9:
        raise ValueError(f"{OP}: tma=True needs a Hopper or newer GPU (TMA); use tma=False")
    if not shape.kv_contiguous:
        raise ValueError(f"{OP}: tma=True needs contiguous k_cache and v_cache ([pages, Hkv, B, d] in that order); "
                         "pass .contiguous() caches or use tma=False")


def prefer_tile(mean_union: float, topk: int, tile_q: int, group: int) -> bool:
    """Tile sharing wins when its MMA rows x union beat the per-token kernel's padded rows x k:
    tile work ~ ``union * BLOCK_M``, per-token work ~ ``tile_q * k * GP`` (GP = G padded to >= 16),
    scaled by the measured efficiency ratio of the two kernels."""
    return mean_union * tile_block_m(tile_q, group) <= _token_work(topk, tile_q, group)


def _token_work(topk: int, tile_q: int, group: int) -> float:
    return TILE_EFFICIENCY * tile_q * topk * max(16, pow2(group))


def tile_flag(count: torch.Tensor, rare_ids: torch.Tensor | None, tile_req: torch.Tensor, topk: int, tile_q: int,
              group: int) -> torch.Tensor:
    """``prefer_tile`` on the device: int32 ``[1]``, 1 = tile design, 0 = per token. The mean union is
    taken over the valid (tile, KV head) pairs; a rare (token, block) pair counts 1 / ``tile_q`` of a
    union block (it costs one token's rows, not a tile's)."""
    valid = tile_req >= 0
    work = (count * valid[:, None]).sum(dtype=torch.float32)
    if rare_ids is not None:
        work = work + (rare_ids >= 0).sum(dtype=torch.float32) / tile_q
    mean_union = work / (valid.sum() * count.shape[1]).clamp(min=1)
    limit = _token_work(topk, tile_q, group)
    return (mean_union * tile_block_m(tile_q, group) <= limit).to(torch.int32).reshape(1)


def tile_wins(plan: PrefillPlan, shape: PrefillShape, count: torch.Tensor, rare_ids: torch.Tensor | None,
              tile_req: torch.Tensor) -> bool:
    """``design="auto"``'s choice once the unions are built: the tile design unless they are past the
    break-even (one host sync)."""
    return bool(tile_flag(count, rare_ids, tile_req, shape.topk, plan.tile_q, shape.group).item())
