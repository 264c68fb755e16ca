"""The forward half of the engine's step: pack the scheduled chunks (`engine.packing`), run the model
(CUDA-graph replay of a decode step when usable, else eager, with the attention's decode plan) and
return the logits of the rows that sample and of the prompt rows being scored.

`StepForward` is `LLMEngine`'s base class: it reads the engine's `model`, `cache`, `attention`,
`blocks`, `scheduler`, `shapes`, `device`, `max_model_len`, `use_cuda_graphs` and `graph_runner`.
"""
from __future__ import annotations

import itertools

import torch

from engine.attention.meta import AttentionMeta
from engine.gpu.async_decode import DecodeRow
from engine.packing import chunk_tokens, pack_chunks
from engine.scheduler import ScheduledChunk


class StepForward:
    _tokens = staticmethod(chunk_tokens)

    def _pack(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, AttentionMeta]:
        """Token ids (or the given `input_ids` `[T]`), positions and attention metadata (`engine.packing`)."""
        return pack_chunks(chunks, self.blocks, self.device, input_ids)

    def _graph_rows(self, rows: list[DecodeRow]) -> tuple[list[tuple[int, int, int, int, int]], list[list[int]]]:
        """(src_row, token, position, slot page, slot offset) and the page ids of each decode row."""
        B, spec, tables = self.cache.page_size, [], []
        for r in rows:
            table = self.blocks.tables[r.seq.request_id]
            tok = self._tokens(r.seq, r.position, r.position + 1)[0] if r.src_row < 0 else 0
            spec.append((r.src_row, tok, r.position, table[r.position // B], r.position % B))
            tables.append(table)
        return spec, tables

    def _forward_logits(self, chunks: list[ScheduledChunk]
                        ) -> tuple[torch.Tensor | None, AttentionMeta, torch.Tensor | None]:
        """Logits fp32 of the rows that sample (`[n_sampling_chunks, vocab]`), the step's metadata, and the
        logits of the scored prompt rows (`[sum of scored_rows, vocab]`, chunk order; None when none score)."""
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        if self._graphs_usable(chunks):
            logits, meta = self.graph_runner.run(*self._graph_rows([DecodeRow(c.seq, c.start) for c in chunks]))
            return (logits[sampling] if len(sampling) < len(chunks) else logits), meta, None
        if not any(c.scored_rows for c in chunks):
            return (*self._eager_logits(chunks), None)
        h, meta = self._eager_hidden(chunks)
        ends = list(itertools.accumulate(meta.q_lens))
        rows = [ends[i] - 1 for i in sampling]
        scored = [ends[i] - c.length + j for i, c in enumerate(chunks) for j in range(c.scored_rows)]
        logits = self.model.logits(h[rows + scored])  # one lm_head call for both kinds of rows
        return (logits[:len(rows)] if rows else None), meta, logits[len(rows):]

    def _eager_hidden(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, AttentionMeta]:
        """Eager forward: final hidden states `[T, hidden]` of every packed token."""
        input_ids, positions, meta = self._pack(chunks, input_ids)
        if meta.is_decode and hasattr(self.attention, "plan_decode"):
            self.attention.plan_decode(meta, self.shapes, key="eager")
        return self.model.hidden_states(input_ids, positions, meta, self.cache, self.attention), meta

    def _eager_logits(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor | None, AttentionMeta]:
        """Eager forward; with `input_ids` (one-step-late decode rows, ahead of the host tokens) every row samples."""
        sampling = list(range(len(chunks))) if input_ids is not None else [i for i, c in enumerate(chunks) if c.samples]
        h, meta = self._eager_hidden(chunks, input_ids)
        if meta.is_decode and len(sampling) == len(chunks) and h.shape[0] == len(chunks):
            return self.model.logits(h), meta  # every row samples: no row gather
        ends = list(itertools.accumulate(meta.q_lens))
        rows = [ends[i] - 1 for i in sampling]
        return (self.model.logits(h[rows]) if rows else None), meta

    def _graphs_usable(self, chunks: list[ScheduledChunk]) -> bool:
        if not self.use_cuda_graphs or any(c.length != 1 or c.scores for c in chunks):
            return False
        if self.graph_runner is None:
            from engine.gpu.graph_runner import DecodeGraphRunner

            max_pages = -(-self.max_model_len // self.cache.page_size)
            self.graph_runner = DecodeGraphRunner(self.model, self.cache, self.attention, self.shapes,
                                                  self.scheduler.cfg.max_num_seqs, max_pages)
        pages = max(c.start // self.cache.page_size + 1 for c in chunks)
        return self.graph_runner.can_run(len(chunks), pages)
