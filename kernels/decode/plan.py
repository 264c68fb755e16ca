"""plan/run for paged decode: ``MSADecodePlan`` (indexer + sparse attention) and ``DenseDecodePlan``
(dense split-K baseline). Every decode choice is made in this file, once:

* the implementation, at construction (``validate.resolve_impl``: Triton on CUDA, the fp32 reference on CPU);
* the K/V cache dtype, at construction (``kv_dtype``): float8_e4m3fn K/V (per-token fp32 ``k_scale`` /
  ``v_scale [P, Hkv, B]`` passed to ``run``) take the same attention kernels with ``KV_FP8``: K/V widened to
  fp16 in registers (``KV_FP8_DOT``), or with ``kv_fp8_dot=True`` e4m3 x e4m3 QK and PV dots (under the
  interpreter that emulates the fp8 dots' rounding); FP8 needs compute capability >= 8.9
  (``kernels._common.fp8.require_fp8``);
* the index keys, at construction (``index_dtype``): float8_e4m3fn keys score with the e4m3 x e4m3
  tensor-core dot on a GPU (``index_fp8_dot=False`` or the interpreter: widened to fp16); int8 keys
  (``kernels/_common/int8.py``) always with the int8 x int8 dot, the queries rounded to int8 per row;
* split counts, rows per program, warps and stages, when ``plan()`` sees new sizes (R, max_pages,
  q_len): from the sizes and the multiprocessor count only, never from lengths, so a CUDA graph
  captured once replays for any lengths that fit the page table. They land in frozen
  ``IndexerLaunch`` / ``AttentionLaunch`` records that the launchers read and do not question.

Lifecycle (msa-spec 5.4):

* ``plan(seq_lens, page_table, q_len)`` once per step, outside CUDA-graph capture (raises
  RuntimeError inside one). It validates the metadata (host sync) and copies it into buffers the plan
  owns; only new sizes reallocate those buffers, the outputs and the workspaces.
* ``run(...)`` once per layer: checks shapes/dtypes only (no host sync), launches kernels into the
  preallocated outputs. Capturable: capture it once after one warm-up run, then call ``plan()`` with
  new lengths/pages of the same sizes (or write ``plan.seq_lens`` / ``plan.page_table`` in place)
  and replay.

Each plan owns its workspace: concurrent streams or graphs need separate plans.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels._common import validate
from kernels._common.device import interpreting, sm_count
from kernels._common.fp8 import FP8, require_fp8

from . import naive
from .launches import AttentionLaunch, IndexerLaunch
from .triton_attention import launch_dense, launch_sparse
from .triton_indexer import launch_indexer

PROGRAMS_PER_SM = 4  # resident programs per multiprocessor that the indexer and dense splits aim for
MAX_INDEXER_SPLITS = 128  # merge width = splits * next_pow2(k - 1) candidates per row
# Measured on an H200 at 128K, q_len 1 (benchmarks/kernels/RESULTS.md, decode): sparse attention at
# ~2 programs per SM with 3 pipeline stages; the indexer at 2 pages per loop iteration with bf16 keys
# and with fp8 keys widened to fp16, 1 page with the fp8 x fp8 dot; 4 warps everywhere.
SPARSE_PROGRAMS_PER_SM = 2
SPARSE_STAGES = 3
INDEX_SHARED_BYTES = 160 << 10  # pipelined index-key pages stay within this much shared memory
# fp8 K/V: K/V widened to fp16 in registers (exact) rather than e4m3 x e4m3 dots (q and p rounded to e4m3 too:
# about 2x the output error of the cache's own rounding on random data). Triton 3.9 for sm90 lowers a 16-row fp8
# dot (q_len 1, G = 16) to the same fp16 mma.sync after the same conversion, so the fp8 dot saves nothing there;
# only >= 64-row tiles (dense with MTP) get the e4m3 wgmma. `--preset fp8` / `fp8mtp` time both.
KV_FP8_DOT = False
# fp8 K/V pages are half the bytes: deeper attention pipelines keep as many bytes in flight. Measured on an H200
# (M3, 128K, batch 64, q_len 1; `--preset fp8` sweeps 2 / 4 / 6): 6 stages gave sparse 58.2 us against 64.5 at 3
# and dense 2820 us against 3356 at 2. Applied to the tiles of at most 32 rows that were measured.
FP8_ATTN_STAGES = 6


@dataclass(frozen=True)
class DecodeTuning:
    """Overrides of the measured launch knobs (kernel-variant tests); None keeps the plan's choice."""

    attn_splits: int | None = None
    attn_warps: int | None = None
    attn_stages: int | None = None
    index_splits: int | None = None
    pages_per_iter: int | None = None
    index_warps: int | None = None
    index_stages: int | None = None


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, x).bit_length() - 1)


def _next_pow2(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def target_programs(device: torch.device) -> int:
    """About four resident programs per multiprocessor (a handful under the interpreter)."""
    return PROGRAMS_PER_SM * sm_count(device)


def dot_precision(dtype: torch.dtype, interpret: bool) -> str:
    """fp32 operands (fp32 inputs, or the interpreter's upcast) get exact products; bf16/fp16 use the
    tensor cores whatever this says (the setting only applies to fp32 operands)."""
    return "ieee" if interpret or dtype == torch.float32 else "tf32"


def in_graph_capture() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _normalize(device: torch.device) -> torch.device:
    """'cuda' -> 'cuda:<current>' so that device checks compare equal to tensors' devices."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class _DecodePlanBase:
    op = "decode"

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                 softmax_scale: float | None = None, return_lse: bool = False, impl: str = "auto",
                 tuning: DecodeTuning | None = None, kv_dtype: torch.dtype | None = None,
                 kv_fp8_dot: bool | None = None):
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        for name, val in (("head_dim", head_dim), ("page_size", page_size)):
            if val < 16 or val & (val - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {val}")
        self.num_q_heads, self.num_kv_heads = num_q_heads, num_kv_heads
        self.head_dim, self.page_size = head_dim, page_size
        self.device, self.dtype = _normalize(torch.device(device)), dtype
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.return_lse = return_lse
        self.impl = validate.resolve_impl(impl, self.device, self.op)
        self.interpret = interpreting()  # dot operands upcast to fp32, no fp8 dot
        # K/V caches: the queries' dtype, or float8_e4m3fn with per-token scales
        self.kv_dtype = dtype if kv_dtype is None else kv_dtype
        if self.kv_dtype not in (dtype, FP8):
            raise ValueError(f"{self.op}: kv_dtype must be the queries' dtype ({dtype}) or torch.float8_e4m3fn, "
                             f"got {self.kv_dtype}")
        self.kv_fp8 = self.kv_dtype == FP8
        if self.kv_fp8:
            if dtype not in validate.FLOAT_DTYPES:
                raise ValueError(f"{self.op}: with fp8 K/V the queries stay bf16/fp16/fp32, got dtype={dtype}")
            require_fp8(self.op, self.device)
        if kv_fp8_dot and not self.kv_fp8:
            raise ValueError(f"{self.op}: kv_fp8_dot=True needs kv_dtype=torch.float8_e4m3fn")
        default_dot = KV_FP8_DOT and not self.interpret  # the interpreter: widened unless asked
        self.kv_fp8_dot = self.kv_fp8 and (kv_fp8_dot if kv_fp8_dot is not None else default_dot)
        self.tuning = tuning or DecodeTuning()
        self.sizes: tuple[int, int, int] | None = None
        self.seq_lens: torch.Tensor | None = None
        self.page_table: torch.Tensor | None = None

    @property
    def q_len(self) -> int:
        return self._need_plan()[2]

    def plan(self, seq_lens: torch.Tensor, page_table: torch.Tensor, q_len: int, num_pages: int | None = None) -> None:
        """seq_lens int32 [R] (including the q_len new tokens), page_table int32 [R, max_pages];
        given the caches' ``num_pages``, the pages the requests use are checked to exist."""
        if in_graph_capture():
            raise RuntimeError("plan() must be called outside CUDA graph capture; capture only run()")
        validate.check_decode_lengths(self.op, seq_lens, page_table, q_len, self.page_size, num_pages)
        sizes = (seq_lens.shape[0], page_table.shape[1], q_len)
        if sizes != self.sizes:
            self.seq_lens = torch.empty(sizes[0], dtype=torch.int32, device=self.device)
            self.page_table = torch.empty(sizes[0], sizes[1], dtype=torch.int32, device=self.device)
            self.sizes = sizes
            self._allocate(*sizes)
        self.seq_lens.copy_(seq_lens)
        self.page_table.copy_(page_table)

    def _need_plan(self) -> tuple[int, int, int]:
        if self.sizes is None:
            raise RuntimeError("call plan(seq_lens, page_table, q_len) before run()")
        return self.sizes

    def _attention_launch(self, splits: int, rows: int, row_blocks: int, warps: int, stages: int) -> AttentionLaunch:
        t = self.tuning
        if self.kv_fp8 and rows <= 32:
            stages = FP8_ATTN_STAGES
        return AttentionLaunch(splits=t.attn_splits or splits, rows=rows, row_blocks=row_blocks,
                               num_warps=t.attn_warps or warps, num_stages=t.attn_stages or stages,
                               dot_fp32=self.interpret, precision=dot_precision(self.dtype, self.interpret),
                               kv_fp8=self.kv_fp8, fp8_dot=self.kv_fp8_dot)

    def _alloc_attention(self, tokens: int) -> None:
        hq, d, splits = self.num_q_heads, self.head_dim, self.attention_launch.splits
        self.out = torch.empty(tokens, hq, d, dtype=self.dtype, device=self.device)
        self.lse = torch.empty(tokens, hq, dtype=torch.float32, device=self.device) if self.return_lse else None
        self.ws_o = torch.empty(tokens, hq, splits, d, dtype=torch.float32, device=self.device) if splits > 1 else None
        self.ws_lse = torch.empty(tokens, hq, splits, dtype=torch.float32, device=self.device) if splits > 1 else None

    def _check_attention(self, q, k_cache, v_cache, out, k_scale, v_scale):
        num_req, _, q_len = self._need_plan()
        tokens = num_req * q_len
        validate.check_attention_tensors(self.op, q, k_cache, v_cache, tokens, k_scale, v_scale)
        validate.check_cache(self.op, "k_cache", k_cache, self.num_kv_heads, self.page_size, self.head_dim,
                             validate.KV_CACHE_DTYPES)
        if k_cache.dtype != self.kv_dtype:
            name = type(self).__name__
            raise ValueError(f"{self.op}: k_cache/v_cache are {k_cache.dtype} but the plan was built for "
                             f"{self.kv_dtype} K/V ({name}(kv_dtype=...))")
        validate.check_query(self.op, "q", q, tokens, self.num_q_heads, self.head_dim, dtypes=(self.dtype,))
        if q.device != self.device:
            raise ValueError(f"q is on {q.device} but the plan was built for {self.device}")
        if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1):
            raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
        return out if out is not None else self.out

    def _finish_ref(self, out, ref_out, ref_lse):
        out.copy_(ref_out)
        if self.lse is not None:
            self.lse.copy_(ref_lse)
        return out


class DenseDecodePlan(_DecodePlanBase):
    """Dense paged split-K decode attention over every page of each request (the baseline)."""

    op = "DenseDecodePlan"

    def _allocate(self, num_req: int, max_pages: int, q_len: int) -> None:
        group_rows = q_len * (self.num_q_heads // self.num_kv_heads)
        rows = min(128, max(16, _next_pow2(group_rows)))  # all query rows of a request and group, in blocks
        row_blocks = -(-group_rows // rows)
        work = num_req * row_blocks * self.num_kv_heads
        splits = max(1, min(max_pages, _pow2_floor(target_programs(self.device) // work)))
        self.attention_launch = self._attention_launch(splits, rows, row_blocks, 4 if rows <= 32 else 8, 2)
        self._alloc_attention(num_req * q_len)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """q [R*q_len, Hq, d], caches [P, Hkv, B, d] (fp8: with fp32 k_scale/v_scale [P, Hkv, B])
        -> out [R*q_len, Hq, d] in q's dtype (LSE in ``self.lse``)."""
        out = self._check_attention(q, k_cache, v_cache, out, k_scale, v_scale)
        if self.impl == "torch":
            ref = naive.dense_decode_attention_ref(q, k_cache, v_cache, self.page_table, self.seq_lens,
                                                   self.q_len, self.softmax_scale, k_scale, v_scale)
            return self._finish_ref(out, *ref)
        return launch_dense(q, k_cache, v_cache, self.page_table, self.seq_lens, self.q_len, self.softmax_scale,
                            out, self.lse, self.ws_o, self.ws_lse, self.attention_launch, k_scale, v_scale)


class MSADecodePlan(_DecodePlanBase):
    """MSA decode step: paged indexer (top-k pages per token and KV group) then sparse attention.

    Extra sizes: ``topk`` (pages per query, own page included), ``index_dim`` (d_idx), ``index_dtype``
    of the index keys (default: ``dtype``; float8_e4m3fn and int8 keys come with a per-token fp32 scale); one
    index head per KV group. ``run_indexer`` writes ``self.topk_ids`` int32 [R*q_len, Hkv, topk].
    """

    op = "MSADecodePlan"

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 topk: int = 16, index_dim: int = 128, index_dtype: torch.dtype | None = None,
                 index_fp8_dot: bool = True, **kwargs):
        super().__init__(num_q_heads, num_kv_heads, head_dim, page_size, **kwargs)
        if not 2 <= topk <= 64:
            raise ValueError(f"topk must be in 2..64, got {topk}")
        if index_dim < 16 or index_dim & (index_dim - 1):
            raise ValueError(f"index_dim must be a power of two >= 16, got {index_dim}")
        self.index_dtype = index_dtype or self.dtype
        if self.index_dtype not in validate.INDEX_KEY_DTYPES:
            raise ValueError(f"index_dtype must be bf16, fp16, fp32, float8_e4m3fn or int8, got {self.index_dtype}")
        self.topk, self.index_dim = topk, index_dim
        self.fp8_keys = self.index_dtype == torch.float8_e4m3fn
        self.int8_keys = self.index_dtype == torch.int8
        self.fp8_dot = self.fp8_keys and index_fp8_dot and not self.interpret

    def _allocate(self, num_req: int, max_pages: int, q_len: int) -> None:
        tokens, hkv = num_req * q_len, self.num_kv_heads
        self.indexer_launch = self._indexer_launch(num_req, max_pages, q_len)
        shape = (tokens, hkv, self.indexer_launch.splits, self.indexer_launch.keep)
        self.ws_val = torch.empty(shape, dtype=torch.float32, device=self.device)
        self.ws_id = torch.empty(shape, dtype=torch.int32, device=self.device)
        self.topk_ids = torch.empty(tokens, hkv, self.topk, dtype=torch.int32, device=self.device)
        # fill the GPU with (token, group, split) programs when T * Hkv alone would not
        target = target_programs(self.device) * SPARSE_PROGRAMS_PER_SM // PROGRAMS_PER_SM
        splits = max(1, min(self.topk, _pow2_floor(target // (tokens * hkv))))
        group = self.num_q_heads // hkv
        self.attention_launch = self._attention_launch(splits, max(16, _next_pow2(group)), 1, 4, SPARSE_STAGES)
        self._alloc_attention(tokens)

    def _indexer_launch(self, num_req: int, max_pages: int, q_len: int) -> IndexerLaunch:
        t = self.tuning
        # split the history pages of a request so that batch 1 still fills the GPU
        splits = max(1, min(MAX_INDEXER_SPLITS, max_pages, _pow2_floor(target_programs(self.device) // num_req)))
        ppi = t.pages_per_iter or (1 if self.fp8_dot or self.int8_keys else 2)
        key_bytes = self.index_dtype.itemsize
        stages = max(1, min(3, INDEX_SHARED_BYTES // (ppi * self.page_size * self.index_dim * key_bytes)))
        q_dtype = torch.float16 if self.fp8_keys or self.int8_keys else self.index_dtype
        return IndexerLaunch(splits=t.index_splits or splits, rows=max(16, _next_pow2(q_len * self.num_kv_heads)),
                             keep=_next_pow2(self.topk - 1), pages_per_iter=ppi, num_warps=t.index_warps or 4,
                             num_stages=t.index_stages or stages, fp8_keys=self.fp8_keys, fp8_dot=self.fp8_dot,
                             int8_keys=self.int8_keys,
                             dot_fp32=self.interpret, precision=dot_precision(q_dtype, self.interpret))

    def run_indexer(self, q_idx: torch.Tensor, k_idx_cache: torch.Tensor,
                    k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
        """q_idx [R*q_len, Hkv, d_idx]; k_idx_cache [P, B, d_idx] (fp8 / int8 need k_idx_scale [P, B])."""
        num_req, _, q_len = self._need_plan()
        heads, page, d_idx = validate.check_index_tensors(self.op, q_idx, k_idx_cache, k_idx_scale,
                                                          num_req * q_len, self.topk)
        if (heads, page, d_idx) != (self.num_kv_heads, self.page_size, self.index_dim):
            raise ValueError(f"index tensors give (H, B, d_idx) = {(heads, page, d_idx)}, the plan expects "
                             f"{(self.num_kv_heads, self.page_size, self.index_dim)}")
        if k_idx_cache.dtype != self.index_dtype:
            raise ValueError(f"k_idx_cache is {k_idx_cache.dtype} but the plan was built for {self.index_dtype} "
                             "index keys (MSADecodePlan(index_dtype=...))")
        if q_idx.device != self.device:
            raise ValueError(f"q_idx is on {q_idx.device} but the plan was built for {self.device}")
        if self.impl == "torch":
            ref = naive.decode_indexer_ref(q_idx, k_idx_cache, self.page_table, self.seq_lens, q_len, self.topk,
                                           k_idx_scale)
            return self.topk_ids.copy_(ref)
        return launch_indexer(q_idx, k_idx_cache, k_idx_scale, self.page_table, self.seq_lens, q_len, self.topk,
                              self.topk_ids, self.ws_val, self.ws_id, self.indexer_launch)

    def run_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      topk_ids: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sparse attention over ``topk_ids`` (default: this plan's indexer output); fp8 caches with their
        fp32 k_scale/v_scale [P, Hkv, B]."""
        out = self._check_attention(q, k_cache, v_cache, out, k_scale, v_scale)
        ids = self.topk_ids if topk_ids is None else topk_ids
        validate.check_topk_shape(self.op, ids, q.shape[0], self.num_kv_heads)
        if self.impl == "torch":
            ref = naive.sparse_decode_attention_ref(q, k_cache, v_cache, ids, self.page_table, self.seq_lens,
                                                    self.q_len, self.softmax_scale, k_scale, v_scale)
            return self._finish_ref(out, *ref)
        return launch_sparse(q, k_cache, v_cache, ids, self.page_table, self.seq_lens, self.q_len,
                             self.softmax_scale, out, self.lse, self.ws_o, self.ws_lse, self.attention_launch,
                             k_scale, v_scale)

    def run(self, q: torch.Tensor, q_idx: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            k_idx_cache: torch.Tensor, k_idx_scale: torch.Tensor | None = None,
            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """One layer's MSA decode: indexer then sparse attention -> out [R*q_len, Hq, d] (fp8 K/V: with
        k_scale/v_scale; the index keys' dtype is the plan's ``index_dtype``, independent of the K/V's)."""
        self.run_indexer(q_idx, k_idx_cache, k_idx_scale)
        return self.run_attention(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, out=out)
