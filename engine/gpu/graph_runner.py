"""CUDA-graph decode: one graph per captured batch size, rows padded to the next captured size.

A graph holds the whole decode forward (embedding, every layer with its attention `run`, final
norm, LM head) over static input buffers. Per step, outside the graph: the inputs are copied in
(one host-to-device copy for ids / positions / slots), the attention's `plan_decode` copies the
lengths and page table into its plan for that batch size, then the graph replays. Padded rows
decode token 0 at position 0 with seq_len 1 on the cache's scratch page, so they never touch a
real request's pages. Graphs are captured lazily, on the first step of each size.
"""
from __future__ import annotations

import bisect

import torch

from engine.attention.meta import AttentionMeta, DecodeShapes

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, logits: torch.Tensor, meta: AttentionMeta):
        self.graph, self.logits, self.meta = graph, logits, meta


class DecodeGraphRunner:
    """Replays captured decode steps for `model` over the paged `cache` with `attention`.

    `max_pages` fixes the page-table width of every graph (the model's context / page size), so
    any lengths up to the context replay the same graph (split counts depend on sizes only)."""

    def __init__(self, model, cache, attention, shapes: DecodeShapes, max_batch: int, max_pages: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES):
        if not getattr(attention, "supports_cuda_graphs", False) or not hasattr(attention, "plan_decode"):
            raise ValueError(f"attention {getattr(attention, 'kind', attention)!r} is not CUDA-graph capturable")
        sizes = sorted({b for b in batch_sizes if b < max_batch} | {max_batch})
        self.model, self.cache, self.attention, self.shapes = model, cache, attention, shapes
        self.batch_sizes, self.max_pages = tuple(sizes), max_pages
        dev, n = shapes.device, sizes[-1]
        self.io = torch.zeros(4, n, dtype=torch.long, device=dev)  # ids, positions, slot pages, slot offsets
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.page_table = torch.full((n, max_pages), -1, dtype=torch.int32, device=dev)
        self.cu = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, _Graph] = {}
        self.pool = None

    def padded_size(self, n: int) -> int | None:
        i = bisect.bisect_left(self.batch_sizes, n)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def can_run(self, n: int, pages: int) -> bool:
        return self.padded_size(n) is not None and pages <= self.max_pages

    def _meta(self, bs: int) -> AttentionMeta:
        return AttentionMeta(cu_seqlens_q=self.cu[:bs + 1], seq_lens_kv=self.seq_lens[:bs],
                             page_table=self.page_table[:bs], slot_pages=self.io[2, :bs],
                             slot_offsets=self.io[3, :bs], q_lens=[1] * bs, kv_lens=[1] * bs, page_lists=[],
                             is_decode=True, in_graph=True)

    def _stage(self, bs: int, rows: list[tuple[int, int, int, int]], seq_lens: torch.Tensor,
               page_table: torch.Tensor, meta: AttentionMeta) -> None:
        """Copy n real rows (token, position, slot page, slot offset) plus padding into the buffers."""
        n = len(rows)
        host = torch.zeros(4, bs, dtype=torch.long)
        host[2] = self.cache.scratch_page
        if n:
            host[:, :n] = torch.tensor(rows, dtype=torch.long).T
        lens = torch.ones(bs, dtype=torch.int32)
        lens[:n] = seq_lens
        table = torch.full((bs, self.max_pages), -1, dtype=torch.int32)
        table[:, 0] = self.cache.scratch_page
        table[:n, :page_table.shape[1]] = page_table
        self.io[:, :bs].copy_(host)
        self.seq_lens[:bs].copy_(lens)
        self.page_table[:bs].copy_(table)
        meta.seq_lens_host, meta.page_table_host = lens, table
        meta.kv_lens = lens.tolist()
        meta.stats = {}
        self.attention.plan_decode(meta, self.shapes, key=bs)

    def _forward(self, bs: int, meta: AttentionMeta) -> torch.Tensor:
        h = self.model.hidden_states(self.io[0, :bs], self.io[1, :bs], meta, self.cache, self.attention)
        return self.model.logits(h)

    def _capture(self, bs: int) -> _Graph:
        meta = self._meta(bs)
        self._stage(bs, [], torch.ones(0, dtype=torch.int32), torch.full((0, 1), -1, dtype=torch.int32), meta)
        side = torch.cuda.Stream(device=self.shapes.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compiles the Triton kernels, warms cuBLAS
                self._forward(bs, meta)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(bs, meta)
        self.pool = graph.pool()
        return _Graph(graph, logits, meta)

    @torch.inference_mode()
    def run(self, rows: list[tuple[int, int, int, int]], seq_lens: torch.Tensor,
            page_table: torch.Tensor) -> tuple[torch.Tensor, AttentionMeta]:
        """rows: (token, position, slot page, slot offset) per request; seq_lens int32 `[n]`, page_table
        int32 `[n, w]` on the CPU. Returns (logits `[n, vocab]` fp32 (valid until the next run), meta)."""
        n = len(rows)
        bs = self.padded_size(n)
        if bs is None or page_table.shape[1] > self.max_pages:
            raise ValueError(f"no captured graph for {n} rows x {page_table.shape[1]} pages")
        g = self.graphs.get(bs)
        if g is None:
            g = self.graphs[bs] = self._capture(bs)
        self._stage(bs, rows, seq_lens, page_table, g.meta)
        g.graph.replay()
        return g.logits[:n], g.meta
