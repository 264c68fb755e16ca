"""The step loop: schedule -> pack -> forward (`engine.forward`) -> sample -> stop checks (`engine.stops`).

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
(`engine.scoring`); such chunks always run eagerly, never as graph rows. So lm-eval's request (prompt
log-probs and max_tokens 1) costs one prefill of its prompt, whose last row also draws the token, and
max_tokens 0 is that prefill alone; `forward_passes` and `prefill_tokens` count the work done.

`LLMEngine` is single-threaded. The drive API: `add_request` / `step` / `abort`, `stream(requests)`
(the one loop: add, step until they finish, abort the rest if the caller stops early) and
`finish(request_id) -> RequestOutput`. `LLM.generate`, the local backend and `msa-eval generate` use
`stream`; the HTTP server's engine thread interleaves its commands with `step` and calls `finish`.

Selection telemetry (`telemetry`, an `engine.msa.telemetry.TelemetryConfig`, MSA attentions only): every
request gets an accumulator on its `Sequence`, each forward hands the batch's accumulators to the
attention (`AttentionMeta.telemetry`), and the result lands in `metrics["msa_telemetry"]`; decode steps
then run eagerly (no CUDA graphs, no one-step-late decode) so that every step's selection is seen.

Constrained requests (`SamplingParams.constraint`) get a grammar (`engine.constrained`) at `add_request`:
each step masks their rows of logits before sampling and feeds the drawn token back; their decode steps
never run one step late (the next mask needs the previous token on the host).
"""
from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Iterator

import torch

from engine.attention.meta import AttentionMeta, DecodeShapes
from engine.constrained import GrammarState, allowed_tokens
from engine.forward import StepForward
from engine.gpu.async_decode import DecodeRow, EagerDecodeLauncher, InflightDecode, follow_up_rows, is_greedy_decode
from engine.gpu.sampler import sample_requests
from engine.kv_cache import BlockManager, KVCache
from engine.model import CausalLM
from engine.msa.telemetry import SelectionTelemetry, TelemetryConfig
from engine.requests import (
    Request,
    RequestOutput,
    StepOutput,
    check_length,
    check_prompt,
    error_output,
    request_output,
    step_output,
)
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from engine.scoring import add_prompt_rows, add_token_rows
from engine.sequence import Sequence
from engine.stops import check_stop
from engine.tokenizer import Tokenizer


class LLMEngine(StepForward):
    def __init__(self, model: CausalLM, tokenizer: Tokenizer, attention, cache: KVCache,
                 sched_cfg: SchedulerConfig, max_model_len: int, device: torch.device, cuda_graphs: bool = True,
                 telemetry: TelemetryConfig | None = None):
        self.model, self.tokenizer, self.attention, self.cache = model, tokenizer, attention, cache
        self.device, self.max_model_len = device, max_model_len
        self.telemetry = telemetry
        cuda_graphs = cuda_graphs and telemetry is None  # a telemetry run sees every decode step's selection
        cfg = model.cfg
        fp8 = cache.cfg.quantized  # decode plans: q in the model dtype, the FP8 kernels for the e4m3 cache
        self.shapes = DecodeShapes(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cache.page_size,
                                   cache.cfg.index_query_dtype, device, cache.cfg.dtype if fp8 else None,
                                   cache.cfg.index_dtype if fp8 else None)
        # CUDA graphs for decode when the attention promises capturable layer calls (its GPU classes do)
        self.use_cuda_graphs = bool(cuda_graphs and getattr(attention, "supports_cuda_graphs", False))
        self.graph_runner = None
        # one-step-late greedy decode (GPU graphs); tests set it on a CPU engine (EagerDecodeLauncher)
        self.async_decode = self.use_cuda_graphs
        self._inflight: InflightDecode | None = None
        self._eager_launcher: EagerDecodeLauncher | None = None
        self.blocks = BlockManager(cache.cfg.num_pages, cache.page_size)
        self.scheduler = Scheduler(sched_cfg, self.blocks)
        self.seqs: dict[str, Sequence] = {}
        # work done, for /metrics and tests: model forward passes, and prompt tokens those passes computed
        self.forward_passes = 0
        self.prefill_tokens = 0

    # -- requests -------------------------------------------------------------------------
    def check_length(self, n: int, params: SamplingParams) -> None:
        """ContextTooLongError when a prompt of `n` tokens (plus one generated token, if any) exceeds the context."""
        check_length(n, params, self.max_model_len)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> Sequence:
        check_prompt(prompt_token_ids, params, self.model.cfg.vocab_size, self.max_model_len)
        if request_id in self.seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, list(prompt_token_ids), params,
                       max_len=min(len(prompt_token_ids) + params.max_tokens, self.max_model_len))
        if self.telemetry is not None:
            seq.telemetry = SelectionTelemetry(len(prompt_token_ids), self.telemetry)
        if params.constraint is not None:  # ConstraintError (a ValueError) for a schema the library refuses
            seq.grammar = GrammarState(params.constraint, self.tokenizer, self.model.cfg.vocab_size)
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
        """Remove a finished request and return its state (KeyError when it is not held)."""
        return self.seqs.pop(request_id)

    def finish(self, request_id: str) -> RequestOutput:
        """Remove a finished request and return its result (raises the error the engine ended it with)."""
        return request_output(self.pop_finished(request_id), self.tokenizer)

    def stream(self, requests: Iterable[Request]) -> Iterator[StepOutput]:
        """The drive loop: add `requests`, step until every one of them has finished, and yield each step's
        outputs (a request that failed yields its error output: `finish` raises the error). The requests
        stay held for `finish`. If the caller stops early (or adding one fails), those not finished
        are aborted."""
        ids: list[str] = []
        try:
            for request_id, prompt_token_ids, params in requests:
                self.add_request(request_id, prompt_token_ids, params)
                ids.append(request_id)
            while self._unfinished(ids):
                yield from self.step()
        finally:
            for i in ids:
                seq = self.seqs.get(i)
                if seq is not None and not seq.finished:
                    self.abort(i)

    def _unfinished(self, ids: Collection[str]) -> bool:
        return self.has_unfinished() and any(not self.seqs[i].finished for i in ids if i in self.seqs)

    def _pack(self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, AttentionMeta]:
        input_ids, positions, meta = super()._pack(chunks, input_ids)
        if self.telemetry is not None:
            meta.telemetry = [c.seq.telemetry for c in chunks]
        return input_ids, positions, meta

    # -- one step (the forward half: engine.forward.StepForward) ---------------------------
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
            except Exception as e:  # noqa: BLE001 - the shared forward pass: its requests end, the engine goes on
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
        except Exception as e:  # noqa: BLE001 - the shared forward pass: this step's requests end, the engine goes on
            return [self._fail(c.seq, e) for c in chunks]
        self.forward_passes += 1
        self.prefill_tokens += sum(min(c.length, len(c.seq.prompt_ids) - c.start) for c in chunks
                                   if c.start < len(c.seq.prompt_ids))
        self._account_stats(chunks, meta)
        for c in chunks:
            c.seq.num_computed += c.length
        faults = add_prompt_rows([c for c in chunks if c.scored_rows], scored)
        samplers = [(row, c.seq) for row, c in enumerate([c for c in chunks if c.samples])
                    if c.seq.request_id not in faults]
        drawn: list[tuple[Sequence, int, torch.Tensor]] = []
        if samplers:
            rows = logits if len(samplers) == logits.shape[0] else logits[[r for r, _ in samplers]]
            seqs = [q for _, q in samplers]
            allowed = allowed_tokens([q.grammar for q in seqs], rows.shape[-1], rows.device)
            drawn, sample_faults = sample_requests(seqs, rows, allowed)
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
        return error_output(seq)

    def _finish_scoring(self, seq: Sequence) -> StepOutput:
        """A score-only request (max_tokens 0) ends with its prefill: no token is drawn."""
        seq.finished, seq.finish_reason, seq.finish_time = True, "length", time.perf_counter()
        self.scheduler.finish(seq)
        return step_output(seq, [])

    # -- one step late (engine.gpu.async_decode) ------------------------------------------
    def _async_usable(self, chunks: list[ScheduledChunk]) -> bool:
        if not self.async_decode or any(c.seq.params.logprobs is not None or c.seq.grammar is not None
                                        for c in chunks):
            return False  # a late step returns tokens only, no logits to score or mask them with
        return self._graphs_usable(chunks) if self.use_cuda_graphs else True

    def _launch(self, rows: list[DecodeRow]) -> InflightDecode:
        self.forward_passes += 1  # decode rows only: no prompt tokens
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
        for i, (r, tok) in enumerate(zip(inflight.rows, toks, strict=True)):
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
            if seq.grammar is not None:
                seq.grammar.advance(tok)
            check_stop(seq, self.tokenizer)
        except Exception as e:  # noqa: BLE001 - this request's grammar or stop handling (e.g. detokenising) only
            return self._fail(seq, e)
        if seq.finished:
            seq.finish_time = time.perf_counter()
            self.scheduler.finish(seq)
        return step_output(seq, [tok])

    def _account_stats(self, chunks: list[ScheduledChunk], meta: AttentionMeta) -> None:
        read, dense = meta.stats.get("keys_read"), meta.stats.get("keys_dense")
        if read is None or dense is None:
            return
        for i, c in enumerate(chunks):
            c.seq.keys_read += read[i]
            c.seq.keys_dense += dense[i]
