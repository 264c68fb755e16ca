"""Launchers of the sparse prefill kernels (shapes already validated by ``op.py``)."""
from __future__ import annotations

import dataclasses

import torch

from kernels._common.tiles import tile_table, token_requests
from kernels._common.validate import interpreting
from kernels.sparse_prefill.config import TileConfig, tile_block_m, triton_next_pow2, use_tma
from kernels.sparse_prefill.grouping import group_tiles
from kernels.sparse_prefill.unions import RARE_WINDOW, TileUnions, build_unions, sort_rare_pairs

_LOG2E = 1.4426950408889634


def _launch_token(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
                  merge=False, num_stages=2, flag=None, rare_ids=None, num_warps=4, block_n=0):
    """One program per (token, KV head). ``merge``: add ``topk_ids``' blocks to the attention state
    already in ``out``/``lse`` (rows with no ids are left as they are). ``flag`` (int32 ``[1]`` on
    the device): gated launch, plain over ``topk_ids`` when 0, merge over ``rare_ids`` when 1.
    ``block_n``: keys per loop step (0: the whole block)."""
    from kernels.sparse_prefill.triton_sparse_attention import _token_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    tok_req = token_requests(cu_seqlens_q, t)
    rare = rare_ids if rare_ids is not None else topk_ids
    _token_kernel[(t * hkv,)](
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, tok_req, topk_ids, out, lse,
        flag if flag is not None else tok_req, rare,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0),
        topk_ids.stride(0), topk_ids.stride(1), out.stride(0), out.stride(1), rare.stride(0), rare.stride(1),
        scale * _LOG2E, HKV=hkv, G=group, GP=max(16, triton_next_pow2(group)), D=d, B=block,
        TOPK=topk_ids.shape[2], UPCAST=interpreting(), MERGE=merge, GATED=flag is not None,
        HAS_RARE=rare_ids is not None, KN=block_n, num_warps=num_warps, num_stages=num_stages)


def _launch_tile(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale, tile_q,
                 num_warps=None, num_stages=None, tiles=None, union=None, rare_max=0,
                 config: TileConfig | None = None, flag=None):
    """Tile kernel over each tile's union; then, if the union left rare blocks out, the per-token
    kernel adds them (``merge``). ``config`` overrides ``tile_q`` / ``num_warps`` / ``num_stages`` /
    ``rare_max``; ``flag`` (device int32 ``[1]``): the gated no-sync launch of ``design="auto"``
    (the tile kernel exits when 0, the token kernel then runs plain over ``topk_ids``)."""
    from kernels.sparse_prefill.triton_sparse_attention import _tile_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    if config is None:
        config = TileConfig(tile_q=tile_q, rare_max=rare_max, num_warps=num_warps, num_stages=num_stages)
    cfg = resolve_config(config, group, block, q, k_cache, v_cache, gated=flag is not None, out=out)
    tile_q = cfg.tile_q
    if group % cfg.head_split:
        raise ValueError(f"msa_prefill_attention: head_split must divide the group size {group}, got {cfg.head_split}")
    for name, value in (("block_n", cfg.block_n), ("rare_block_n", cfg.rare_block_n)):
        if value and (block % value or value < 16):
            raise ValueError(f"msa_prefill_attention: {name} must divide the block size {block} and be >= 16, "
                             f"got {value}")
    if cfg.rare_pass not in ("token", "window", "tail", "items"):
        raise ValueError(f"msa_prefill_attention: rare_pass must be 'token', 'window', 'tail' or 'items', "
                         f"got {cfg.rare_pass!r}")
    if cfg.rare_pass == "items" and cfg.kernel != "gluon":
        raise ValueError("msa_prefill_attention: rare_pass='items' runs in the Gluon tile kernel (kernel='gluon', "
                         "Hopper); use rare_pass='token'")
    if cfg.rare_pass == "tail" and cfg.head_split != 1:
        raise ValueError(f"msa_prefill_attention: rare_pass='tail' needs head_split=1, got {cfg.head_split}")
    if cfg.kernel not in ("triton", "gluon"):
        raise ValueError(f"msa_prefill_attention: kernel must be 'triton' or 'gluon', got {cfg.kernel!r}")
    hopper = sm_major(q.device) >= 9
    block_m = tile_block_m(tile_q, group, cfg.head_split)
    contiguous = k_cache.is_contiguous() and v_cache.is_contiguous()
    if cfg.kernel == "gluon":
        _check_gluon(cfg, q, contiguous, block_m, flag)
    tma = cfg.kernel == "triton" and use_tma(cfg.tma, hopper, block_m, contiguous)
    kdesc, vdesc = k_cache, v_cache  # unused unless tma
    if tma:
        kdesc, vdesc = _kv_descriptors(k_cache, v_cache, cfg.block_n or block, hopper)
    extra = dict(maxnreg=cfg.maxnreg) if cfg.maxnreg and hopper else {}  # measured on the H200 only
    tile_req, tile_start = tiles or tile_table(cu_seqlens_q, t, tile_q, longest_first=False)
    if union is None:
        union = tile_unions_for(cfg, topk_ids, page_table, cu_seqlens_q, (tile_req, tile_start))
    tail = flag is None and union.rare_ids is not None and cfg.rare_pass == "tail"
    rare = union.rare_ids if tail else union.count
    if cfg.kernel == "gluon":
        from kernels.sparse_prefill.gluon_tile import launch_gluon_tile

        launch_gluon_tile(q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv, tile_req, tile_start, union,
                          scale * _LOG2E, group, tile_q, cfg.block_n or block, cfg.num_stages,
                          persistent=cfg.persistent, q_tma=cfg.q_tma, pingpong=cfg.pingpong,
                          dynamic=cfg.dynamic)
    else:
        _tile_kernel[(tile_req.shape[0] * hkv * cfg.head_split,)](
            q, k_cache, v_cache, cu_seqlens_q, seq_lens_kv, tile_req, tile_start,
            union.union, union.pages, union.token_mask, union.count, out, lse,
            flag if flag is not None else union.count, union.tokmap if union.tokmap is not None else union.count,
            page_table, rare, kdesc, vdesc, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
            union.union.stride(0), union.union.stride(1), page_table.stride(0), rare.stride(0),
            rare.stride(1) if tail else 0, scale * _LOG2E,
            HKV=hkv, G=group, TQ=tile_q, BLOCK_M=block_m, D=d, B=block,
            UPCAST=interpreting(), HSPLIT=cfg.head_split, LAZY=cfg.lazy, EXP_FMA=cfg.exp_fma,
            GATED=flag is not None, BN=cfg.block_n, GROUPED=union.tokmap is not None, TAIL=tail,
            TOPK=topk_ids.shape[2], TMA=tma, HEAD_MAJOR=cfg.head_major, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages, **extra)
    if flag is not None:  # one gated launch: plain per token when the flag is 0, else the merge
        _launch_token(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, topk_ids, out, lse, scale,
                      num_stages=cfg.rare_stages, flag=flag, rare_ids=union.rare_ids)
    elif tail:
        pass  # the tile kernel added the rare blocks itself
    elif union.rare_ids is not None and cfg.rare_pass == "items":
        launch_rare_items(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union.rare_ids, out, lse, scale,
                          cfg)
    elif union.rare_ids is not None and cfg.rare_pass == "window":
        _launch_rare_window(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union.rare_ids, out, lse,
                            scale, cfg)
    elif union.rare_list is not None:
        _launch_token_list(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union, out, lse, scale,
                           cfg.rare_stages)
    elif union.rare_ids is not None:
        launch_rare_merge(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union.rare_ids, out, lse, scale,
                          cfg, block_m)


def resolve_config(config: TileConfig, group: int, block: int, q, k_cache, v_cache, gated: bool,
                   out: torch.Tensor | None = None) -> TileConfig:
    """``config`` resolved for this launch: the Gluon tile kernel by default on sm_90 (``default_kernel``),
    the Triton one for the gated no-sync launch and for non-contiguous caches; the items rare pass by
    default with the Gluon kernel unless ``q`` or ``out`` is not contiguous; the regrouping's sizes
    checked (before any kernel runs)."""
    for name, value in (("group_words", config.group_words), ("group_window", config.group_window)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"msa_prefill_attention: {name} must be a power of two, got {value}")
    if config.kernel is None and (gated or not (k_cache.is_contiguous() and v_cache.is_contiguous())):
        config = dataclasses.replace(config, kernel="triton")
    if config.rare_pass is None and not (q.is_contiguous() and (out is None or out.is_contiguous())):
        config = dataclasses.replace(config, rare_pass="token")
    return config.resolved(group, block, sm90=sm_major(q.device) == 9)


def sm_major(device: torch.device) -> int:
    """The GPU's compute-capability major (9: Hopper), 0 under the interpreter or off CUDA."""
    return 0 if interpreting() or device.type != "cuda" else torch.cuda.get_device_capability(device)[0]


def _check_gluon(cfg: TileConfig, q: torch.Tensor, contiguous: bool, block_m: int, flag) -> None:
    """The Gluon tile kernel's limits, each a ValueError naming the fix."""
    if sm_major(q.device) != 9:
        raise ValueError("msa_prefill_attention: kernel='gluon' needs a Hopper GPU (sm_90); use kernel='triton'")
    if block_m != 128 or cfg.head_split != 1:
        raise ValueError(f"msa_prefill_attention: kernel='gluon' needs 128-row tiles (tile_q x group = 128, "
                         f"head_split 1), got {block_m} rows; use kernel='triton'")
    if not contiguous:
        raise ValueError("msa_prefill_attention: kernel='gluon' needs contiguous k_cache and v_cache ([pages, Hkv, "
                         "B, d] in that order: TMA); pass .contiguous() caches or use kernel='triton'")
    if flag is not None or cfg.rare_pass == "tail":
        raise ValueError("msa_prefill_attention: kernel='gluon' runs with the 'items', 'token' or 'window' rare "
                         "pass and design='tile'; use kernel='triton' for design='auto_device' or rare_pass='tail'")


def launch_rare_merge(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, rare_ids, out, lse, scale,
                      cfg: TileConfig, block_m: int):
    """The per-token merge pass of the rare blocks with ``cfg``'s launch options (2 warps and
    ``rare_block_n`` keys per step for 128-row tiles unless set: run 7)."""
    _launch_token(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, rare_ids, out, lse, scale, merge=True,
                  num_stages=cfg.rare_stages, num_warps=cfg.rare_warps or (2 if block_m >= 128 else 4),
                  block_n=cfg.rare_block_n)


def launch_rare_items(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, rare_ids, out, lse, scale,
                      cfg: TileConfig):
    """The rare pairs bucketed into items of up to ``tile_q`` tokens that share a block
    (``rare_items.py``), merged by the Gluon kernel's rare mode, one launch per round. An item is one
    block, so the rare mode always takes whole blocks in 2 stages (the run-9 measurements; it fits
    the shared memory whatever the tile kernel's ``block_n`` / ``num_stages``)."""
    from kernels.sparse_prefill.gluon_tile import launch_gluon_rare
    from kernels.sparse_prefill.rare_items import build_rare_items

    group = q.shape[1] // k_cache.shape[1]
    items = build_rare_items(rare_ids, page_table, cu_seqlens_q, cfg.tile_q)
    launch_gluon_rare(q, k_cache, v_cache, out, lse, cu_seqlens_q, seq_lens_kv, items, scale * _LOG2E, group,
                      cfg.tile_q, k_cache.shape[2], 2)


def _kv_descriptors(k_cache, v_cache, rows: int, hopper: bool):
    """Tensor descriptors of ``rows x d`` tiles over the caches seen as ``[pages * Hkv * B, d]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not interpreting() and not hopper:
        raise ValueError("msa_prefill_attention: tma=True needs a Hopper or newer GPU (TMA); use tma=False")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("msa_prefill_attention: tma=True needs contiguous k_cache and v_cache "
                         "([pages, Hkv, B, d] in that order); pass .contiguous() caches or use tma=False")
    d = k_cache.shape[-1]
    return (TensorDescriptor.from_tensor(k_cache.view(-1, d), [rows, d]),
            TensorDescriptor.from_tensor(v_cache.view(-1, d), [rows, d]))


def persistent_programs(device, per_sm: int, items: int) -> int:
    """Grid of a persistent launch: ``per_sm`` programs per SM (2 SMs under the interpreter), at most
    one per item."""
    sms = 2 if interpreting() else torch.cuda.get_device_properties(device).multi_processor_count
    return min(items, per_sm * sms)


def _launch_token_list(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, union: TileUnions, out, lse,
                       scale, num_stages):
    """The rare merge pass over ``union.rare_list``: a persistent grid (4 programs per SM)."""
    from kernels.sparse_prefill.triton_sparse_attention import _token_list_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    rare = union.rare_ids
    _token_list_kernel[(persistent_programs(q.device, 4, t * hkv),)](
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, token_requests(cu_seqlens_q, t), rare, out, lse,
        union.rare_list, union.rare_count, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0),
        out.stride(0), out.stride(1), rare.stride(0), rare.stride(1), scale * _LOG2E, HKV=hkv, G=group,
        GP=max(16, triton_next_pow2(group)), D=d, B=block, TOPK=rare.shape[2], UPCAST=interpreting(),
        num_warps=4, num_stages=num_stages)


def tile_unions_for(cfg: TileConfig, topk_ids, page_table, cu_seqlens_q, tiles) -> TileUnions:
    """The unions the tile kernel loops over for a resolved ``cfg``: tiles regrouped first if
    ``cfg.group``, rare blocks split off at ``cfg.rare_max``, listed only for the per-token pass
    (``rare_list``; the window and tail passes read ``rare_ids`` directly)."""
    tokmap = (group_tiles(topk_ids, cu_seqlens_q, *tiles, cfg.tile_q, words=cfg.group_words, window=cfg.group_window)
              if cfg.group else None)
    return build_unions(topk_ids, page_table, cu_seqlens_q, *tiles, cfg.tile_q, rare_max=cfg.rare_max, tokmap=tokmap,
                        rare_list=cfg.rare_list and cfg.rare_pass == "token")


def _launch_rare_window(q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, rare_ids, out, lse, scale,
                        cfg: TileConfig):
    """Merge the rare pairs into the tile kernel's out / LSE, one program per (window, KV head)."""
    from kernels.sparse_prefill.triton_sparse_attention import _rare_window_kernel

    t, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    keys, count = sort_rare_pairs(rare_ids)
    block_m = max(16, triton_next_pow2(cfg.rare_chunk * group))
    n_items = keys.shape[0] * hkv
    n_prog = persistent_programs(q.device, 2, n_items)  # each with its own scratch
    scr_o = torch.empty((n_prog, RARE_WINDOW * group, d), dtype=torch.float32, device=q.device)
    scr_l = torch.empty((n_prog, RARE_WINDOW * group), dtype=torch.float32, device=q.device)
    _rare_window_kernel[(n_prog,)](
        q, k_cache, v_cache, page_table, cu_seqlens_q, seq_lens_kv, token_requests(cu_seqlens_q, t), keys, count,
        out, lse, scr_o, scr_l, n_items, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0),
        out.stride(0), out.stride(1),
        keys.stride(0), keys.stride(1), scale * _LOG2E, HKV=hkv, G=group, CH=cfg.rare_chunk, BLOCK_M=block_m,
        D=d, B=block, WIN=RARE_WINDOW, UPCAST=interpreting(), EXP_FMA=cfg.exp_fma, BN=cfg.block_n,
        num_warps=cfg.rare_warps or (8 if block_m >= 128 else 4), num_stages=1)


def tile_union_stats(union: TileUnions, tile_req: torch.Tensor) -> dict:
    """Mean union blocks per valid (tile, KV head) and rare blocks per (token, KV head), on the host."""
    valid = tile_req >= 0
    mean_u = union.count[valid].float().mean().item() if bool(valid.any()) else 0.0
    rare = (union.rare_ids >= 0).float().sum(-1).mean().item() if union.rare_ids is not None else 0.0
    return dict(mean_union=mean_u, rare_per_token=rare)
