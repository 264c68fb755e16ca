"""CUDA-graph decode: one graph per captured batch size, rows padded to the next captured size.

A graph holds the whole decode step over static buffers (`engine.gpu.step_buffers.StepBuffers`):
the input ids (`ops.select_ids`: the previous step's sampled token, still on the device, or a host
token), embedding, every layer with its attention `run`, final norm, LM head and the greedy argmax
(written to `StepBuffers.tokens`). Per step, outside the graph: the rows are written into the host
master and staged with ONE host-to-device copy, then the graph replays. The attention's decode plans
are planned once, at capture, and their length / page-table buffers are rebound to the step
buffers' views, so no `plan()` call (validation, two more copies) runs per step; an attention whose
plans cannot be rebound gets `plan_decode` every step as before. Padded rows decode token 0 at
position 0 with seq_len 1 on the cache's scratch page, so they never touch a real request's pages.
Graphs are captured lazily, on the first step of each size.

Two ways to run a step: `run` (replay, return the logits: the engine samples on the host side) and
`launch` (replay, copy the argmax tokens to pinned host memory without waiting, return a
`PendingTokens`: the one-step-late decode of `engine.gpu.async_decode`).
"""
from __future__ import annotations

import bisect

import torch

from engine.attention.meta import AttentionMeta, DecodeShapes
from engine.gpu.ops import select_ids
from engine.gpu.step_buffers import StepBuffers

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
Row = tuple[int, int, int, int, int]  # (src_row, token, position, slot page, slot offset)


class PendingTokens:
    """Tokens of a launched step, copied to pinned host memory behind an event."""

    def __init__(self, host: torch.Tensor, event: torch.cuda.Event, stats: dict):
        self.host, self.event, self.stats = host, event, stats

    def result(self) -> list[int]:
        self.event.synchronize()
        return self.host.tolist()


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, logits: torch.Tensor, meta: AttentionMeta, bound: bool):
        self.graph, self.logits, self.meta, self.bound = graph, logits, meta, bound


def _plans_of(decode_plan) -> list:
    """The kernel plans behind an attention's `meta.decode_plan` (a plan, or a holder with `plans()`)."""
    if decode_plan is None:
        return []
    if hasattr(decode_plan, "plans"):
        return list(decode_plan.plans())
    return [decode_plan]


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
        self.graphs: dict[int, _Graph] = {}
        self.pool = None
        self._bufs: StepBuffers | None = None
        self._cu: torch.Tensor | None = None
        self._tok_host: list[torch.Tensor] = []
        self._tok_k = 0

    def padded_size(self, n: int) -> int | None:
        i = bisect.bisect_left(self.batch_sizes, n)
        return self.batch_sizes[i] if i < len(self.batch_sizes) else None

    def can_run(self, n: int, pages: int) -> bool:
        return self.padded_size(n) is not None and pages <= self.max_pages

    @property
    def bufs(self) -> StepBuffers:
        if self._bufs is None:
            n, dev = self.batch_sizes[-1], self.shapes.device
            self._bufs = StepBuffers(n, self.max_pages, self.cache.scratch_page, dev)
            self._cu = torch.arange(n + 1, dtype=torch.int32, device=dev)
            self._tok_host = [torch.zeros(n, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        return self._bufs

    def _meta(self, bs: int) -> AttentionMeta:
        b = self.bufs
        return AttentionMeta(cu_seqlens_q=self._cu[:bs + 1], seq_lens_kv=b.seq_lens[:bs],
                             page_table=b.page_table[:bs], slot_pages=b.io[3, :bs], slot_offsets=b.io[4, :bs],
                             q_lens=[1] * bs, kv_lens=[1] * bs, page_lists=[], is_decode=True, in_graph=True)

    def _bind_plans(self, bs: int, meta: AttentionMeta) -> bool:
        """Point the decode plans' length / page-table buffers at the step buffers (same shapes), so a
        staged step needs no `plan()`. False (plan every step) if a plan does not have that form."""
        b, plans = self.bufs, _plans_of(meta.decode_plan)
        want = {"seq_lens": b.seq_lens[:bs], "page_table": b.page_table[:bs]}
        for p in plans:
            for name, view in want.items():
                t = getattr(p, name, None)
                if not isinstance(t, torch.Tensor) or t.shape != view.shape or t.dtype != view.dtype:
                    return False
        for p in plans:
            for name, view in want.items():
                setattr(p, name, view)
        return bool(plans)

    def _plan_step(self, g: _Graph, bs: int, lens: list[int]) -> None:
        meta = g.meta
        meta.kv_lens = lens
        meta.q_lens = [1] * len(lens)
        meta.stats = {}
        if not g.bound:
            meta.seq_lens_host, meta.page_table_host = self.bufs.host_views(bs)
            self.attention.plan_decode(meta, self.shapes, key=bs)
        elif hasattr(self.attention, "decode_stats"):
            self.attention.decode_stats(meta)

    def _forward(self, bs: int, meta: AttentionMeta) -> torch.Tensor:
        b = self.bufs
        ids = select_ids(b.io[0, :bs], b.io[1, :bs], b.tokens)
        h = self.model.hidden_states(ids, b.io[2, :bs], meta, self.cache, self.attention)
        logits = self.model.logits(h)
        torch.argmax(logits, dim=-1, out=b.tokens[:bs])
        return logits

    def _capture(self, bs: int) -> _Graph:
        # a step may be in flight (one-step-late decode): finish it, and keep its sampled tokens, which
        # the warm-up forwards below overwrite and the next step reads
        torch.cuda.synchronize(self.shapes.device)
        b = self.bufs
        saved = b.tokens.clone()
        meta = self._meta(bs)
        b.write([], [])
        b.stage()
        meta.seq_lens_host, meta.page_table_host = b.host_views(bs)
        meta.kv_lens = [1] * bs
        self.attention.plan_decode(meta, self.shapes, key=bs)
        bound = self._bind_plans(bs, meta)
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
        b.tokens.copy_(saved)
        return _Graph(graph, logits, meta, bound)

    def _replay(self, rows: list[Row], tables: list[list[int]]) -> tuple[_Graph, int]:
        n = len(rows)
        bs = self.padded_size(n)
        if bs is None:
            raise ValueError(f"no captured graph for {n} rows")
        g = self.graphs.get(bs)
        if g is None:
            g = self.graphs[bs] = self._capture(bs)
        b = self.bufs
        b.write(rows, tables)
        b.stage()
        self._plan_step(g, bs, [r[2] + 1 for r in rows])
        g.graph.replay()
        return g, n

    @torch.inference_mode()
    def run(self, rows: list[Row], tables: list[list[int]]) -> tuple[torch.Tensor, AttentionMeta]:
        """rows: (src_row, token, position, slot page, slot offset) per request; tables: each request's page
        ids. Returns (logits `[n, vocab]` fp32 (valid until the next replay), meta)."""
        g, n = self._replay(rows, tables)
        return g.logits[:n], g.meta

    @torch.inference_mode()
    def launch(self, rows: list[Row], tables: list[list[int]]) -> PendingTokens:
        """Replay and copy the greedy tokens to pinned host memory without waiting for the GPU."""
        g, n = self._replay(rows, tables)
        host = self._tok_host[self._tok_k]
        self._tok_k ^= 1
        host[:n].copy_(self.bufs.tokens[:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingTokens(host[:n], event, g.meta.stats)
