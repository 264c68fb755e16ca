"""The step loop: schedule -> pack -> forward -> sample -> stop checks.

On a GPU, decode steps replay CUDA graphs (`engine.gpu.graph_runner`) when the attention is
capturable and `cuda_graphs` is on; everything else (prefill chunks, mixed steps, graphs off)
runs eagerly. Greedy rows are sampled together on the device (one argmax, one host copy).
Greedy decode steps from graphs run one step late (`engine.gpu.async_decode`, `async_decode`):
`step()` launches the next decode step before it applies the tokens of the one in flight, so
its returned outputs are the previous launch's (a call may return none while a step is in flight).

Faults stay with their request: a fault in one request's sampling, log-probs or stop handling
finishes that request with finish_reason "error" (`StepOutput.error`, `Sequence.error`; its pages
are freed) and the rest of the batch carries on; a fault in the shared forward pass ends the
requests of that step only, and the engine keeps serving the others and new ones.
Scoring (`SamplingParams.prompt_logprobs`) rides on the request's own prefill chunks
(`engine.scoring`); such chunks always run eagerly, never as graph rows.

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
from engine.packing import chunk_tokens, pack_chunks
from engine.sampling import SamplingParams
from engine.scoring import LogprobRow, add_prompt_rows, add_token_rows
from engine.gpu.async_decode import (DecodeRow, EagerDecodeLauncher, InflightDecode, follow_up_rows,
                                     is_greedy_decode)
from engine.gpu.sampler import sample_requests
from engine.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.tokenizer import Tokenizer


@dataclass
class StepOutput:
    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # with finish_reason "error": what went wrong, one line
    logprobs: list[LogprobRow] | None = None  # the new tokens' rows (params.logprobs)
    prompt_logprobs: list[LogprobRow] | None = None  # on the request's first output (params.prompt_logprobs)


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
        vocab = self.model.cfg.vocab_size
        if not 0 <= min(prompt_token_ids) <= max(prompt_token_ids) < vocab:  # else the shared forward fails
            raise ValueError(f"prompt token ids must lie in 0..{vocab - 1}, got {min(prompt_token_ids)}.."
                             f"{max(prompt_token_ids)}: encode the prompt with this model's tokenizer")
        if n + (params.max_tokens > 0) > self.max_model_len:
            room = " (room for at least one generated token is needed)" if params.max_tokens else ""
            raise ContextTooLongError(
                f"prompt has {n} tokens but the model's context is {self.max_model_len}{room}: shorten the prompt",
                limit=self.max_model_len, length=n)
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
        cpu_dense = self.device.type == "cpu" and isinstance(self.attention, DenseAttention)  # batched CPU plan
        if meta.is_decode and hasattr(self.attention, "plan_decode") and (self.device.type == "cuda" or cpu_dense):
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

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        outs: list[StepOutput] = []
        prev, self._inflight = self._inflight, None
        if prev is not None:  # launch the follow-up first, then apply the in-flight tokens
            try:
                rows = follow_up_rows(prev, self.scheduler)
                if rows is not None and self._async_usable([ScheduledChunk(r.seq, r.position, 1) for r in rows]):
                    self._inflight = self._launch(rows)
                outs = self._complete(prev)
            except Exception as e:  # the shared forward pass: its requests end, the engine goes on
                self._inflight = None
                return [self._fail(r.seq, e) for r in prev.rows if not r.seq.finished]
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
        try:
            logits, meta, scored = self._forward_logits(chunks)
        except Exception as e:  # the shared forward pass: this step's requests end, the engine goes on
            return [self._fail(c.seq, e) for c in chunks]
        self._account_stats(chunks, meta)
        for c in chunks:
            c.seq.num_computed += c.length
        faults = add_prompt_rows([c for c in chunks if c.scored_rows], scored)
        samplers = [(row, c.seq) for row, c in enumerate([c for c in chunks if c.samples])
                    if c.seq.request_id not in faults]
        drawn: list[tuple[Sequence, int, torch.Tensor]] = []
        if samplers:
            rows = logits if len(samplers) == logits.shape[0] else logits[[r for r, _ in samplers]]
            drawn, sample_faults = sample_requests([q for _, q in samplers], rows)
            faults |= sample_faults | add_token_rows(drawn)
        outs = [self._fail(c.seq, faults[c.seq.request_id]) for c in chunks if c.seq.request_id in faults]
        outs += [self._append_token(seq, tok) for seq, tok, _ in drawn if seq.request_id not in faults]
        return outs + [self._finish_scoring(c.seq) for c in chunks if c.seq.params.max_tokens == 0
                       and c.seq.pending == 0 and c.seq.request_id not in faults]

    # -- per-request outcomes -------------------------------------------------------------
    def _fail(self, seq: Sequence, exc: Exception) -> StepOutput:
        """End one request with an error: its pages are freed, every other request carries on."""
        seq.finished, seq.finish_reason, seq.error = True, "error", exc
        seq.finish_time = time.perf_counter()
        self.scheduler.finish(seq)
        return StepOutput(seq.request_id, [], True, "error", error=f"{type(exc).__name__}: {exc}")

    def _finish_scoring(self, seq: Sequence) -> StepOutput:
        """A score-only request (max_tokens 0) ends with its prefill: no token is drawn."""
        seq.finished, seq.finish_reason, seq.finish_time = True, "length", time.perf_counter()
        self.scheduler.finish(seq)
        return self._output(seq, [])

    def _output(self, seq: Sequence, new: list[int]) -> StepOutput:
        first = len(seq.output_ids) == len(new)  # the output that ends the prefill carries the prompt's rows
        return StepOutput(seq.request_id, new, seq.finished, seq.finish_reason,
                          logprobs=seq.output_logprobs[-len(new):] if new and seq.params.logprobs is not None else None,
                          prompt_logprobs=seq.prompt_logprobs if first else None)

    # -- one step late (engine.gpu.async_decode) ------------------------------------------
    def _async_usable(self, chunks: list[ScheduledChunk]) -> bool:
        if not self.async_decode or any(c.seq.params.logprobs is not None for c in chunks):
            return False  # a late step returns tokens only, no logits to score them with
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
        try:
            self._check_stop(seq)
        except Exception as e:  # this request's stop handling (e.g. detokenising its tail) only
            return self._fail(seq, e)
        if seq.finished:
            seq.finish_time = time.perf_counter()
            self.scheduler.finish(seq)
        return self._output(seq, [tok])

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
