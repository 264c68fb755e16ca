"""Launch configuration of the tile-sharing kernel and the tile-vs-token design choice.

Every default here was measured on one H200 (M3 shape, selections of the real indexer on structured
inputs); ``benchmarks/prefill/RESULTS.md`` names the run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Break-even measured on an H200 (M3 shape, G = 16, TQ = 8, bf16, benchmarks/prefill/RESULTS.md run 2):
# the tile kernel costs about 0.65 ms per union block per 64K tokens (16.8 ms at union 25.0), the
# per-token kernel 31.3 ms, so it wins below a union of ~3 k; per row of MMA work the 128-row tile
# is ~3x as efficient as the 16-row per-token tile (2.4x before the run-2 tile kernel).
_TILE_EFFICIENCY = 3.0


@dataclass(frozen=True)
class TileConfig:
    """How the tile design runs (``None`` fields: the defaults below for the shape).

    tile_q: tokens per tile (power of two <= 32); rare_max: blocks chosen by at most this many of a
    tile's tokens go to the per-token merge pass (0: off); head_split: programs per (tile, KV head),
    each over ``G / head_split`` heads; num_warps / num_stages: the tile kernel's; rare_stages: the
    merge pass's pipeline stages; lazy / exp_fma: the tile kernel's softmax options (see
    ``triton_sparse_attention.py``); block_n: keys per loop step (0: the whole block; ``B / block_n``
    steps per union block); maxnreg: register cap per thread of the tile kernel (0: the compiler's
    choice; applied on Hopper and newer only); with 128-row tiles the defaults are 64 keys per step,
    a 128-register cap, 3 stages (2 in run 6; ``default_tile_stages``) and rare_max 1: two 8-warp
    programs fit on an SM (98 KB of shared memory, 128 x 256 registers each) and one's softmax
    overlaps the other's MMAs (run 6: 64K 15.13 -> 14.06-14.41 ms, 128K 31.85 -> 30.05-30.45 ms; the
    tile loop 419 -> 483 TFLOP/s executed);
    rare_pass: how the rare pairs are added, "token" (one program per token and KV head, each pair's
    K/V read for that token alone) or "window" (one program per window of 128 packed tokens and KV
    head: the tokens that chose the same rare block share one K/V read, up to ``rare_chunk`` tokens
    per step, 0: ``tile_q``; measured 30-90% slower: opt-in); rare_warps / rare_block_n: the rare
    pass's warps and keys per step (``None``: the token pass with 128-row tiles takes 2 warps and
    64-key steps, run 7: 2.67-2.84 -> 2.15-2.27 ms at 128K, 39.8 -> 34.2 at 1M; else 4 warps and
    whole blocks; the window pass 8 warps at 128 rows, else 4); group: regroup each window of
    ``group_window`` tiles (16) by shared selections (``grouping.py``) instead of tiles of neighbours
    (default on with 128-row tiles: run 6, 64K 14.05 -> 13.5 ms and 128K 29.6 -> 28.5 ms with the
    regrouping kernel's 0.5-1.5 ms included); group_words / group_window: 32-bit words of the hashed
    block sets the regrouping compares / tiles per regrouped window (powers of two; run 8: 8 or 16
    words, 32-tile windows leave the unions unchanged and are slower); rare_list: the per-token rare
    pass runs persistent over the compact list of the (token, KV head) items that have rare blocks
    instead of one program per item (run 6: 1-5% slower, opt-in); rare_pass "tail": each tile program
    adds its own tokens' rare blocks after its store (token by token, as the per-token pass) hoping
    that memory-bound work overlaps the other program's MMAs on the SM (head_split 1 only; run 7: 3-7%
    slower at 64K / 128K, opt-in); tma: the
    tile loop's K / V steps through tensor descriptors (the copy engine; Hopper and newer, contiguous
    caches; ``None``: on for 128-row tiles on Hopper when the caches are contiguous, run 7: tile
    kernel 3-4% faster, 24.24 -> 23.18 ms at 128K, 227.0 -> 219.2 at 1M; True where it cannot run is a
    ValueError); head_major: the tile programs run KV head by KV head instead of tile by tile (run 7:
    no faster, opt-in); kernel: "triton" (``_tile_kernel``) or "gluon" (``gluon_tile.py``: a producer
    warp feeding TMA copies to two consumer warpgroups, Hopper, 128-row tiles, head_split 1, K / V
    block_n keys per step, whole blocks and 2 stages unless set, the token or window rare pass;
    ``None``: ``default_kernel``, run 8: tile kernel alone 23.24 -> 20.54 ms at 128K); persistent: the
    Gluon kernel runs one program per SM, each taking (tile, KV head) items in turn (``None``: on for
    the Gluon kernel, run 8: 21.12 -> 20.55 ms at 128K); q_tma: the Gluon kernel's producer warp copies
    each item's Q with TMA into one of two buffers (groups of 8 or 16 heads, contiguous q) instead of
    the consumers loading it (run 8: 20.98 -> 19.98 ms at 128K, 197.0 -> 190.3 at 1M); dynamic: a
    persistent Gluon program takes its next item from a global counter instead of every SM-th one, so
    the items in flight stay neighbours (run 8: 19.98 -> 19.69 ms at 128K, 190.3 -> 182.3 at 1M);
    pingpong: its two consumer warpgroups take turns to issue their MMAs (run 8: no faster, opt-in);
    rare_pass "items" (Gluon kernel only): the rare pairs bucketed by (round, KV head, request,
    block) into items of up to ``tile_q`` tokens (``rare_items.py``), each item's K / V read once for
    its tokens by the Gluon kernel's rare mode, which merges into the output (one launch per round);
    ``None``: "items" with the Gluon kernel where it runs (groups of 8 or 16 heads, Q by TMA, contiguous
    q and out; then rare_max 2 by default), else "token" (run 9: rare pass alone at 1M 34.4 -> 18.4 ms
    at rare_max 1, 69.7 -> 41.1 at rare_max 2).
    Run 5 (RESULTS.md) measured the softmax and split options; only ``exp_fma``
    was not slower, so it is the one on by default.
    """
    tile_q: int | None = None
    rare_max: int | None = None
    head_split: int = 1
    num_warps: int | None = None
    num_stages: int | None = None
    rare_stages: int = 2
    lazy: bool = False
    exp_fma: bool = True  # run 5: 32.08 vs 32.24 ms at 128K, 15.12 vs 15.30 at 64K (about the noise)
    block_n: int | None = None
    maxnreg: int | None = None
    rare_pass: str | None = None
    group: bool | None = None
    rare_list: bool = False
    group_words: int = 4  # run 6: regrouping 0.40 vs 0.60 ms at 64K (8 words), attention as fast
    group_window: int = 16
    rare_chunk: int = 0
    rare_warps: int | None = None
    rare_block_n: int | None = None
    tma: bool | None = None
    head_major: bool = False
    kernel: str | None = None
    persistent: bool | None = None
    q_tma: bool = True
    pingpong: bool = False
    dynamic: bool = True

    def resolved(self, group: int, block: int = 128, sm90: bool = False) -> "TileConfig":
        """This config with every ``None`` replaced by the default for a group of ``group`` heads, KV
        blocks of ``block`` keys and (the tile kernel) a Hopper GPU or not."""
        tile_q = self.tile_q or default_tile_q(group)
        block_m = tile_block_m(tile_q, group, self.head_split)
        kernel = self.kernel or default_kernel(sm90, block_m, self.head_split, self.rare_pass)
        wide = block_m >= 128  # the two-programs-per-SM defaults (run 6)
        gluon = kernel == "gluon"  # whole blocks per step, 2 stages (run 8)
        block_n = (0 if gluon else 64 if wide and block > 64 else 0) if self.block_n is None else self.block_n
        items = gluon and self.rare_pass is None and group in (8, 16) and self.q_tma  # run 9
        rare_pass = "items" if items else (self.rare_pass or "token")
        return TileConfig(tile_q=tile_q,
                          rare_max=default_rare_max(group, rare_pass) if self.rare_max is None else self.rare_max,
                          head_split=self.head_split, num_warps=self.num_warps or (8 if wide else 4),
                          num_stages=self.num_stages or (2 if gluon else default_tile_stages(block_m)),
                          rare_stages=self.rare_stages, lazy=self.lazy, exp_fma=self.exp_fma,
                          block_n=block_n, maxnreg=(128 if wide else 0) if self.maxnreg is None else self.maxnreg,
                          rare_pass=rare_pass, group=wide if self.group is None else self.group,
                          group_words=self.group_words, group_window=self.group_window, rare_list=self.rare_list,
                          rare_chunk=self.rare_chunk or tile_q, rare_warps=self.rare_warps,
                          rare_block_n=(64 if wide and block > 64 else 0) if self.rare_block_n is None
                          else self.rare_block_n, tma=self.tma,
                          head_major=self.head_major, kernel=kernel,
                          persistent=gluon if self.persistent is None else self.persistent, q_tma=self.q_tma,
                          pingpong=self.pingpong, dynamic=self.dynamic)


def default_kernel(sm90: bool, block_m: int, head_split: int, rare_pass: str) -> str:
    """The tile kernel when ``TileConfig.kernel`` is None: the warp-specialised Gluon kernel where it
    runs (sm_90, 128-row tiles, no head split, not the tail rare pass; run 8), else the Triton one.
    The launch also keeps the Triton kernel for non-contiguous caches and the gated no-sync design."""
    fits = sm90 and block_m == 128 and head_split == 1 and rare_pass != "tail"
    return "gluon" if fits and gluon_available() else "triton"


def gluon_available() -> bool:
    """Whether this Triton has Gluon's Hopper language (wgmma, TMA, mbarriers, warp_specialize)."""
    try:
        from triton.experimental.gluon.language.nvidia import hopper
    except ImportError:
        return False
    return hasattr(hopper, "warpgroup_mma")


def use_tma(tma: bool | None, hopper: bool, block_m: int, contiguous: bool) -> bool:
    """Whether the tile loop loads K / V through tensor descriptors: ``tma`` if set, else on for
    128-row tiles on Hopper or newer with contiguous caches (run 7; narrower tiles not measured)."""
    return tma if tma is not None else hopper and block_m >= 128 and contiguous


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tile_block_m(tile_q: int, group: int, head_split: int = 1) -> int:
    """MMA rows of one tile program: ``tile_q x G / head_split`` padded to a power of two >= 16."""
    return max(16, triton_next_pow2(tile_q * (group // head_split)))


def default_rare_max(group: int, rare_pass: str = "token") -> int:
    """Blocks selected by at most this many tokens of a tile go to the rare pass (0: none).

    With the per-token pass, 1 for G >= 8 (measured on the H200, M3 shape, 8-token tiles: the split
    made the run-4 kernel 7-9% faster at 2; with run 6's faster tile loop 1 is 1-2% faster than 2,
    benchmarks/prefill/RESULTS.md); with the items pass, whose pairs share K / V, 2 (run 9: whole
    attention 128K 20.8-21.1 -> 20.3-20.4 ms, 256K 43.6-44.0 -> 43.0-43.1 against rare_max 1); small
    groups are not measured: off.
    """
    if group < 8:
        return 0
    return 2 if rare_pass == "items" else 1


def default_tile_stages(block_m: int) -> int:
    """Pipeline stages of the tile kernel: 3 at 128 rows, else 2. Whole-block steps: run 4, 36.0 vs
    36.8 ms at 128K. 64-key steps with TMA (the default on Hopper): run 7, 12.13 / 12.36 vs 12.33 /
    12.50 ms at 64K, a tie at 128K; the TMA pipeline keeps two K / V buffers, so the shared memory
    stays at 98 KB (two programs per SM). 64-key steps with pointer loads: run 6, 14.30 vs 14.17 ms
    at 64K, 30.53 vs 30.81 at 128K (a tie)."""
    return 3 if block_m >= 128 else 2


def default_tile_q(group: int) -> int:
    """Tokens per tile: 8 x G rows for G >= 8 (128 rows at G = 16), 16 tokens for small groups."""
    return 8 if group >= 8 else 16


def _threshold(topk: int, tile_q: int, group: int) -> tuple[int, float]:
    block_m = max(16, triton_next_pow2(tile_q * group))
    rows_per_token = max(16, triton_next_pow2(group))
    return block_m, _TILE_EFFICIENCY * tile_q * topk * rows_per_token


def prefer_tile(mean_union: float, topk: int, tile_q: int, group: int) -> bool:
    """Tile sharing wins when its MMA rows x union beat the per-token kernel's padded rows x k.

    Tile work ~ ``union * BLOCK_M``; per-token work ~ ``tile_q * k * GP`` (GP = G padded to >= 16),
    scaled by the measured efficiency ratio of the two kernels.
    """
    block_m, limit = _threshold(topk, tile_q, group)
    return mean_union * block_m <= limit


def tile_flag(count: torch.Tensor, rare_ids: torch.Tensor | None, tile_req: torch.Tensor, topk: int,
              tile_q: int, group: int) -> torch.Tensor:
    """``prefer_tile`` on the device, no host sync: int32 ``[1]``, 1 = tile design, 0 = per token.

    The mean union is taken over the valid (tile, KV head) pairs; a rare (token, block) pair counts
    1 / ``tile_q`` of a union block (it costs one token's rows, not a tile's).
    """
    valid = tile_req >= 0
    work = (count * valid[:, None]).sum(dtype=torch.float32)
    if rare_ids is not None:
        work = work + (rare_ids >= 0).sum(dtype=torch.float32) / tile_q
    mean_union = work / (valid.sum() * count.shape[1]).clamp(min=1)
    block_m, limit = _threshold(topk, tile_q, group)
    return (mean_union * block_m <= limit).to(torch.int32).reshape(1)
