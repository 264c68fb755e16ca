"""plan/run wrappers for paged decode: ``MSADecodePlan`` (indexer + sparse attention) and
``DenseDecodePlan`` (dense split-K baseline).

Lifecycle (msa-spec 5.4):

* ``plan(seq_lens, page_table, q_len)`` once per step, outside CUDA-graph capture (raises
  RuntimeError inside one). It validates the metadata (host sync), copies it into buffers the plan
  owns, and - only when the sizes (R, max_pages, q_len) change - reallocates those buffers, the
  outputs and the workspaces and recomputes the split counts (sizes only).
* ``run(...)`` once per layer: checks shapes/dtypes only (no host sync), launches kernels into the
  preallocated outputs. Capturable: capture it once after one warm-up run, then call ``plan()`` with
  new lengths/pages of the same sizes (or write ``plan.seq_lens`` / ``plan.page_table`` in place)
  and replay.

Each plan owns its workspace: concurrent streams or graphs need separate plans.
"""
from __future__ import annotations

import math

import torch

from . import naive, validate
from .attention_triton import dense_rows, launch_dense, launch_sparse
from .dispatch import (dense_splits, in_graph_capture, indexer_splits, indexer_tuning, resolve_impl,
                       sparse_splits, sparse_tuning)
from .indexer_triton import launch_indexer


def _normalize(device: torch.device) -> torch.device:
    """'cuda' -> 'cuda:<current>' so that device checks compare equal to tensors' devices."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class _DecodePlanBase:
    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16,
                 softmax_scale: float | None = None, return_lse: bool = False, impl: str = "auto",
                 num_splits: int | None = None):
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
        self.impl = resolve_impl(impl, self.device)
        self.interpret = self.device.type != "cuda"
        self.forced_splits = num_splits
        self.sizes: tuple[int, int, int] | None = None
        self.seq_lens: torch.Tensor | None = None
        self.page_table: torch.Tensor | None = None

    @property
    def q_len(self) -> int:
        return self._need_plan()[2]

    def plan(self, seq_lens: torch.Tensor, page_table: torch.Tensor, q_len: int) -> None:
        """seq_lens int32 [R] (including the q_len new tokens), page_table int32 [R, max_pages]."""
        if in_graph_capture():
            raise RuntimeError("plan() must be called outside CUDA graph capture; capture only run()")
        validate.check_metadata_values(seq_lens, page_table, q_len, self.page_size)
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

    def _alloc_attention(self, tokens: int, splits: int) -> None:
        hq, d = self.num_q_heads, self.head_dim
        self.out = torch.empty(tokens, hq, d, dtype=self.dtype, device=self.device)
        self.lse = torch.empty(tokens, hq, dtype=torch.float32, device=self.device) if self.return_lse else None
        self.attn_splits = splits
        self.ws_o = torch.empty(tokens, hq, splits, d, dtype=torch.float32, device=self.device) if splits > 1 else None
        self.ws_lse = torch.empty(tokens, hq, splits, dtype=torch.float32, device=self.device) if splits > 1 else None

    def _check_attention(self, q, k_cache, v_cache, out):
        num_req, _, q_len = self._need_plan()
        tokens = num_req * q_len
        validate.check_attention_tensors(q, k_cache, v_cache, tokens)
        validate.check_cache("k_cache", k_cache, self.num_kv_heads, self.page_size, self.head_dim)
        validate.check_query("q", q, tokens, self.num_q_heads, self.head_dim, dtypes=(self.dtype,))
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

    def _allocate(self, num_req: int, max_pages: int, q_len: int) -> None:
        _, nrb = dense_rows(q_len, self.num_q_heads // self.num_kv_heads)
        splits = self.forced_splits or dense_splits(num_req * nrb * self.num_kv_heads, max_pages, self.device)
        self._alloc_attention(num_req * q_len, splits)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """q [R*q_len, Hq, d], caches [P, Hkv, B, d] -> out [R*q_len, Hq, d] (LSE in ``self.lse``)."""
        out = self._check_attention(q, k_cache, v_cache, out)
        if self.impl == "torch":
            ref = naive.dense_decode_attention_ref(q, k_cache, v_cache, self.page_table, self.seq_lens,
                                                   self.q_len, self.softmax_scale)
            return self._finish_ref(out, *ref)
        return launch_dense(q, k_cache, v_cache, self.page_table, self.seq_lens, self.q_len, self.softmax_scale,
                            out, self.lse, self.ws_o, self.ws_lse, self.attn_splits, self.interpret)


_TUNING_KEYS = {"pages_per_iter", "num_warps", "num_stages", "attn_num_warps", "attn_num_stages"}


class MSADecodePlan(_DecodePlanBase):
    """MSA decode step: paged indexer (top-k pages per token and KV group) then sparse attention.

    Extra sizes: ``topk`` (pages per query, own page included), ``index_dim`` (d_idx); one index
    head per KV group. ``run_indexer`` writes ``self.topk_ids`` int32 [R*q_len, Hkv, topk].
    """

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 topk: int = 16, index_dim: int = 128, indexer_splits: int | None = None,
                 index_fp8_dot: bool | None = None, tuning: dict | None = None, **kwargs):
        super().__init__(num_q_heads, num_kv_heads, head_dim, page_size, **kwargs)
        if not 2 <= topk <= 64:
            raise ValueError(f"topk must be in 2..64, got {topk}")
        if index_dim < 16 or index_dim & (index_dim - 1):
            raise ValueError(f"index_dim must be a power of two >= 16, got {index_dim}")
        self.topk, self.index_dim = topk, index_dim
        self.forced_indexer_splits = indexer_splits
        # index_fp8_dot: with fp8 keys, also quantise q_idx per row to e4m3 and dot on the fp8 tensor
        # cores (approximate, like the keys); None = on for fp8 keys on a GPU, False = widen the keys to
        # fp16 and dot with the fp16 queries; tuning: launch-knob overrides for benchmarks
        # (indexer: pages_per_iter, num_warps, num_stages; attention: attn_num_warps, attn_num_stages)
        self.index_fp8_dot = index_fp8_dot
        self.tuning = dict(tuning or {})
        unknown = set(self.tuning) - _TUNING_KEYS
        if unknown:
            raise ValueError(f"tuning keys must be among {sorted(_TUNING_KEYS)}, got {sorted(unknown)}")

    def _allocate(self, num_req: int, max_pages: int, q_len: int) -> None:
        tokens, hkv = num_req * q_len, self.num_kv_heads
        self.index_splits = self.forced_indexer_splits or indexer_splits(num_req, max_pages, self.device)
        kp = 1 << (self.topk - 2).bit_length()  # next_pow2(topk - 1)
        self.ws_val = torch.empty(tokens, hkv, self.index_splits, kp, dtype=torch.float32, device=self.device)
        self.ws_id = torch.empty(tokens, hkv, self.index_splits, kp, dtype=torch.int32, device=self.device)
        self.topk_ids = torch.empty(tokens, hkv, self.topk, dtype=torch.int32, device=self.device)
        splits = self.forced_splits or sparse_splits(tokens, hkv, self.topk, self.device)
        self._alloc_attention(tokens, splits)

    def run_indexer(self, q_idx: torch.Tensor, k_idx_cache: torch.Tensor,
                    k_idx_scale: torch.Tensor | None = None) -> torch.Tensor:
        """q_idx [R*q_len, Hkv, d_idx]; k_idx_cache [P, B, d_idx] (fp8 needs k_idx_scale [P, B])."""
        num_req, _, q_len = self._need_plan()
        heads, page, d_idx = validate.check_index_tensors(q_idx, k_idx_cache, k_idx_scale, num_req * q_len, self.topk)
        if (heads, page, d_idx) != (self.num_kv_heads, self.page_size, self.index_dim):
            raise ValueError(f"index tensors give (H, B, d_idx) = {(heads, page, d_idx)}, the plan expects "
                             f"{(self.num_kv_heads, self.page_size, self.index_dim)}")
        if q_idx.device != self.device:
            raise ValueError(f"q_idx is on {q_idx.device} but the plan was built for {self.device}")
        if self.impl == "torch":
            ref = naive.decode_indexer_ref(q_idx, k_idx_cache, self.page_table, self.seq_lens, q_len, self.topk,
                                           k_idx_scale)
            return self.topk_ids.copy_(ref)
        fp8_keys = k_idx_scale is not None
        fp8_dot = fp8_keys and self.index_fp8_dot is not False and not self.interpret
        knobs = {**indexer_tuning(fp8_keys, fp8_dot), **{k: v for k, v in self.tuning.items()
                                                         if k in ("pages_per_iter", "num_warps", "num_stages")}}
        return launch_indexer(q_idx, k_idx_cache, k_idx_scale, self.page_table, self.seq_lens, q_len, self.topk,
                              self.topk_ids, self.ws_val, self.ws_id, self.index_splits, self.interpret,
                              fp8_dot=fp8_dot, **knobs)

    def run_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      topk_ids: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sparse attention over ``topk_ids`` (default: this plan's indexer output)."""
        out = self._check_attention(q, k_cache, v_cache, out)
        ids = self.topk_ids if topk_ids is None else topk_ids
        validate.check_topk_ids(ids, q.shape[0], self.num_kv_heads)
        if self.impl == "torch":
            ref = naive.sparse_decode_attention_ref(q, k_cache, v_cache, ids, self.page_table, self.seq_lens,
                                                    self.q_len, self.softmax_scale)
            return self._finish_ref(out, *ref)
        knobs = {**sparse_tuning(), **{k[5:]: v for k, v in self.tuning.items() if k.startswith("attn_")}}
        return launch_sparse(q, k_cache, v_cache, ids, self.page_table, self.seq_lens, self.q_len,
                             self.softmax_scale, out, self.lse, self.ws_o, self.ws_lse, self.attn_splits,
                             self.interpret, **knobs)

    def run(self, q: torch.Tensor, q_idx: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            k_idx_cache: torch.Tensor, k_idx_scale: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """One layer's MSA decode: indexer then sparse attention -> out [R*q_len, Hq, d]."""
        self.run_indexer(q_idx, k_idx_cache, k_idx_scale)
        return self.run_attention(q, k_cache, v_cache, out=out)
