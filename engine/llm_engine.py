"""The step loop: schedule -> pack -> forward -> sample -> stop checks.

On a GPU, decode steps replay CUDA graphs (`engine.gpu.graph_runner`) when the attention is
capturable and `cuda_graphs` is on; everything else (prefill chunks, mixed steps, graphs off)
runs eagerly. Greedy rows are sampled together on the device (one argmax, one host copy).
Greedy decode steps from graphs run one step late (`engine.gpu.async_decode`, `async_decode`):
`step()` launches the next decode step before it applies the tokens of the one in flight, so
its returned outputs are the previous launch's (a call may return none while a step is in flight).

`LLMEngine` is single-threaded; the offline `LLM.generate` and the HTTP server both drive it
through `add_request` / `step` / `abort`.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass

import torch

from engine.attention.dense import DenseAttention
from engine.attention.meta import AttentionMeta, DecodeShapes
from engine.errors import ContextTooLongError
from engine.kv_cache import BlockManager, KVCache
from engine.model import CausalLM
from engine.sampling import SamplingParams
from engine.gpu.async_decode import (DecodeRow, EagerDecodeLauncher, InflightDecode, follow_up_rows,
                                     is_greedy_decode)
from engine.gpu.sampler import sample_batch
from engine.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.tokenizer import Tokenizer


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None


class LLMEngine:
    def __init__(self, model: CausalLM, tokenizer: Tokenizer, attention, cache: KVCache,
                 sched_cfg: SchedulerConfig, max_model_len: int, device: torch.device, cuda_graphs: bool = True):
        self.model, self.tokenizer, self.attention, self.cache = model, tokenizer, attention, cache
        self.device, self.max_model_len = device, max_model_len
        cfg = model.cfg
        self.shapes = DecodeShapes(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cache.page_size, cache.cfg.dtype,
                                   device)
        # CUDA graphs for decode when on a GPU and the attention promises capturable layer calls
        self.use_cuda_graphs = bool(cuda_graphs and device.type == "cuda"
                                    and getattr(attention, "supports_cuda_graphs", False))
        self.graph_runner = None
        if device.type == "cuda" and os.environ.get("MSA_EVAL_FUSED_DECODE") == "1":  # opt-in: measured slower
            from engine.gpu.fused_decode import attach

            attach(model)
        # one-step-late greedy decode (GPU graphs); tests set it on a CPU engine (EagerDecodeLauncher)
        self.async_decode = self.use_cuda_graphs
        self._inflight: InflightDecode | None = None
        self._eager_launcher: EagerDecodeLauncher | None = None
        self.blocks = BlockManager(cache.cfg.num_pages, cache.page_size)
        self.scheduler = Scheduler(sched_cfg, self.blocks)
        self.seqs: dict[str, Sequence] = {}

    # -- requests -------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> Sequence:
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("empty prompt: give at least one token")
        if n >= self.max_model_len:
            raise ContextTooLongError(
                f"prompt has {n} tokens but the model's context is {self.max_model_len} (room for at least "
                f"one generated token is needed): shorten the prompt", limit=self.max_model_len, length=n)
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, list(prompt_token_ids), params,
                       max_len=min(n + params.max_tokens, self.max_model_len))
        self.scheduler.add(seq)
        self.seqs[request_id] = seq
        return seq

    def abort(self, request_id: str) -> None:
        seq = self.scheduler.abort(request_id)
        if seq is not None:
            seq.finished, seq.finish_reason = True, "abort"
        self.seqs.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def pop_finished(self, request_id: str) -> Sequence:
        return self.seqs.pop(request_id)

    # -- one step -------------------------------------------------------------------------
    @staticmethod
    def _tokens(seq: Sequence, start: int, end: int) -> list[int]:
        n = len(seq.prompt_ids)
        if end <= n:
            return seq.prompt_ids[start:end]
        if start >= n:
            return seq.output_ids[start - n:end - n]
        return seq.prompt_ids[start:] + seq.output_ids[:end - n]

    def _pack(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, AttentionMeta]:
        """Pack the chunks' tokens (or the given `input_ids` `[T]`), positions and attention metadata."""
        ids, pos, slot_p, slot_o, cu = [], [], [], [], [0]
        q_lens, kv_lens, page_lists, tables = [], [], [], []
        B = self.cache.page_size
        for c in chunks:
            rid, end = c.seq.request_id, c.start + c.length
            table = self.blocks.tables[rid]
            if input_ids is None:
                ids += self._tokens(c.seq, c.start, end)
            if c.length == 1:
                pos.append(c.start)
                slot_p.append(table[c.start // B])
                slot_o.append(c.start % B)
            else:
                p = torch.arange(c.start, end)
                pos.append(p)
                slot_p.append(self.blocks.table_tensor(rid)[p // B].long())
                slot_o.append(p % B)
            cu.append(cu[-1] + c.length)
            q_lens.append(c.length)
            kv_lens.append(end)
            n_pages = -(-end // B)
            page_lists.append(table[:n_pages])
            tables.append(self.blocks.table_tensor(rid)[:n_pages])
        dev = self.device
        pt = torch.nn.utils.rnn.pad_sequence(tables, batch_first=True, padding_value=-1)
        lens = torch.tensor(kv_lens, dtype=torch.int32)

        def cat(parts: list) -> torch.Tensor:
            return torch.cat([torch.as_tensor(x, dtype=torch.long).reshape(-1) for x in parts]).to(dev)

        meta = AttentionMeta(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev), seq_lens_kv=lens.to(dev),
            page_table=pt.to(dev), slot_pages=cat(slot_p), slot_offsets=cat(slot_o), q_lens=q_lens,
            kv_lens=kv_lens, page_lists=page_lists, is_decode=all(q == 1 for q in q_lens),
            seq_lens_host=lens, page_table_host=pt)
        return (torch.tensor(ids, device=dev) if input_ids is None else input_ids), cat(pos), meta

    def _graph_rows(self, rows: list[DecodeRow]) -> tuple[list[tuple[int, int, int, int, int]], list[list[int]]]:
        """(src_row, token, position, slot page, slot offset) and the page ids of each decode row."""
        B, spec, tables = self.cache.page_size, [], []
        for r in rows:
            table = self.blocks.tables[r.seq.request_id]
            tok = self._tokens(r.seq, r.position, r.position + 1)[0] if r.src_row < 0 else 0
            spec.append((r.src_row, tok, r.position, table[r.position // B], r.position % B))
            tables.append(table)
        return spec, tables

    def _forward_logits(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor | None, AttentionMeta]:
        """Logits `[n_sampling_chunks, vocab]` fp32 of the rows that sample this step."""
        sampling = [i for i, c in enumerate(chunks) if c.samples]
        if self._graphs_usable(chunks):
            logits, meta = self.graph_runner.run(*self._graph_rows([DecodeRow(c.seq, c.start) for c in chunks]))
            return (logits[sampling] if len(sampling) < len(chunks) else logits), meta
        return self._eager_logits(chunks)

    def _eager_logits(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor | None, AttentionMeta]:
        """Eager forward; with `input_ids` (one-step-late decode rows, ahead of the host tokens) every row samples."""
        sampling = list(range(len(chunks))) if input_ids is not None else [i for i, c in enumerate(chunks) if c.samples]
        input_ids, positions, meta = self._pack(chunks, input_ids)
        cpu_dense = self.device.type == "cpu" and isinstance(self.attention, DenseAttention)  # batched CPU plan
        if meta.is_decode and hasattr(self.attention, "plan_decode") and (self.device.type == "cuda" or cpu_dense):
            self.attention.plan_decode(meta, self.shapes, key="eager")
        h = self.model.hidden_states(input_ids, positions, meta, self.cache, self.attention)
        if meta.is_decode and len(sampling) == len(chunks) and h.shape[0] == len(chunks):
            return self.model.logits(h), meta  # every row samples: no row gather
        ends = list(itertools.accumulate(meta.q_lens))
        rows = [ends[i] - 1 for i in sampling]
        return (self.model.logits(h[rows]) if rows else None), meta

    def _graphs_usable(self, chunks: list[ScheduledChunk]) -> bool:
        if not self.use_cuda_graphs or any(c.length != 1 for c in chunks):
            return False
        if self.graph_runner is None:
            from engine.gpu.graph_runner import DecodeGraphRunner

            max_pages = -(-self.max_model_len // self.cache.page_size)
            self.graph_runner = DecodeGraphRunner(self.model, self.cache, self.attention, self.shapes,
                                                  self.scheduler.cfg.max_num_seqs, max_pages)
        pages = max(c.start // self.cache.page_size + 1 for c in chunks)
        return self.graph_runner.can_run(len(chunks), pages)

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        outs: list[StepOutput] = []
        prev, self._inflight = self._inflight, None
        if prev is not None:  # launch the follow-up first, then apply the in-flight tokens
            rows = follow_up_rows(prev, self.scheduler)
            if rows is not None and self._async_usable([ScheduledChunk(r.seq, r.position, 1) for r in rows]):
                self._inflight = self._launch(rows)
            outs = self._complete(prev)
            if self._inflight is not None:
                return outs
        return outs + self._step_scheduled()

    def _step_scheduled(self) -> list[StepOutput]:
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        now = time.perf_counter()
        for c in chunks:
            if c.seq.first_scheduled is None:
                c.seq.first_scheduled = now
        if is_greedy_decode(chunks) and self._async_usable(chunks):
            self._inflight = self._launch([DecodeRow(c.seq, c.start) for c in chunks])
            return []
        logits, meta = self._forward_logits(chunks)
        self._account_stats(chunks, meta)
        samplers = [c for c in chunks if c.samples]
        toks = sample_batch(logits, [c.seq.params for c in samplers], [c.seq.generator for c in samplers]) \
            if samplers else []
        for c in chunks:
            c.seq.num_computed += c.length
        return [self._append_token(c.seq, tok) for c, tok in zip(samplers, toks)]

    # -- one step late (engine.gpu.async_decode) ------------------------------------------
    def _async_usable(self, chunks: list[ScheduledChunk]) -> bool:
        if not self.async_decode:
            return False
        return self._graphs_usable(chunks) if self.use_cuda_graphs else True

    def _launch(self, rows: list[DecodeRow]) -> InflightDecode:
        if self.use_cuda_graphs:
            return InflightDecode(rows, self.graph_runner.launch(*self._graph_rows(rows)))
        if self._eager_launcher is None:
            self._eager_launcher = EagerDecodeLauncher(self)
        return InflightDecode(rows, self._eager_launcher.launch(rows))

    def _complete(self, inflight: InflightDecode) -> list[StepOutput]:
        """Apply an in-flight step's tokens; a request finished since its launch drops its token."""
        toks = inflight.pending.result()
        read, dense = inflight.pending.stats.get("keys_read"), inflight.pending.stats.get("keys_dense")
        outs = []
        for i, (r, tok) in enumerate(zip(inflight.rows, toks)):
            seq = r.seq
            if seq.finished:
                continue
            seq.num_computed += 1
            if read is not None and dense is not None:
                seq.keys_read += read[i]
                seq.keys_dense += dense[i]
            outs.append(self._append_token(seq, tok))
        return outs

    def _append_token(self, seq: Sequence, tok: int) -> StepOutput:
        seq.output_ids.append(tok)
        if seq.first_token is None:
            seq.first_token = time.perf_counter()
        self._check_stop(seq)
        if seq.finished:
            seq.finish_time = time.perf_counter()
            self.scheduler.finish(seq)
        return StepOutput(seq.request_id, [tok], seq.finished, seq.finish_reason)

    def _account_stats(self, chunks: list[ScheduledChunk], meta: AttentionMeta) -> None:
        read, dense = meta.stats.get("keys_read"), meta.stats.get("keys_dense")
        if read is None or dense is None:
            return
        for i, c in enumerate(chunks):
            c.seq.keys_read += read[i]
            c.seq.keys_dense += dense[i]

    def _check_stop(self, seq: Sequence) -> None:
        p, tok = seq.params, seq.output_ids[-1]
        if not p.ignore_eos and tok in self.tokenizer.eos_token_ids:
            seq.finished, seq.finish_reason = True, "stop"
        elif tok in p.stop_token_ids:
            seq.finished, seq.finish_reason = True, "stop"
        elif p.stop and self._stop_string_hit(seq):
            seq.finished, seq.finish_reason = True, "stop"
        elif len(seq.output_ids) >= p.max_tokens or seq.total_len >= seq.max_len:
            seq.finished, seq.finish_reason = True, "length"

    def _stop_string_hit(self, seq: Sequence) -> bool:
        # decode only a tail window: a stop string can only end in the newest text
        longest = max(len(s) for s in seq.params.stop)
        tail = self.tokenizer.decode(seq.output_ids[-(longest + 8):])
        return any(s in tail for s in seq.params.stop)
