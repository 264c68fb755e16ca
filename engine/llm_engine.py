"""The step loop: schedule -> pack -> forward -> sample -> stop checks.

`LLMEngine` is single-threaded; the offline `LLM.generate` and the HTTP server both drive it
through `add_request` / `step` / `abort`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.attention.meta import AttentionMeta
from engine.errors import ContextTooLongError
from engine.kv_cache import BlockManager, KVCache
from engine.model import CausalLM
from engine.sampling import SamplingParams, sample
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
                 sched_cfg: SchedulerConfig, max_model_len: int, device: torch.device):
        self.model, self.tokenizer, self.attention, self.cache = model, tokenizer, attention, cache
        self.device, self.max_model_len = device, max_model_len
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
    def _pack(self, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, torch.Tensor, AttentionMeta]:
        ids, pos, slot_p, slot_o, cu = [], [], [], [], [0]
        q_lens, kv_lens, page_lists = [], [], []
        B = self.cache.page_size
        for c in chunks:
            table = self.blocks.tables[c.seq.request_id]
            toks = c.seq.all_ids[c.start:c.start + c.length]
            p = list(range(c.start, c.start + c.length))
            ids += toks
            pos += p
            slot_p += [table[i // B] for i in p]
            slot_o += [i % B for i in p]
            cu.append(cu[-1] + c.length)
            q_lens.append(c.length)
            kv_lens.append(c.start + c.length)
            page_lists.append(table[: -(-(c.start + c.length) // B)])
        dev = self.device
        max_pages = max(len(p) for p in page_lists)
        pt = torch.full((len(chunks), max_pages), -1, dtype=torch.int32)
        for r, p in enumerate(page_lists):
            pt[r, : len(p)] = torch.tensor(p, dtype=torch.int32)
        meta = AttentionMeta(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            seq_lens_kv=torch.tensor(kv_lens, dtype=torch.int32, device=dev),
            page_table=pt.to(dev), slot_pages=torch.tensor(slot_p, device=dev),
            slot_offsets=torch.tensor(slot_o, device=dev), q_lens=q_lens, kv_lens=kv_lens,
            page_lists=page_lists, is_decode=all(q == 1 for q in q_lens))
        return torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta

    @torch.inference_mode()
    def step(self) -> list[StepOutput]:
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        now = time.perf_counter()
        for c in chunks:
            if c.seq.first_scheduled is None:
                c.seq.first_scheduled = now
        input_ids, positions, meta = self._pack(chunks)
        h = self.model.hidden_states(input_ids, positions, meta, self.cache, self.attention)
        rows = [int(meta.cu_seqlens_q[i + 1]) - 1 for i, c in enumerate(chunks) if c.samples]
        logits = self.model.logits(h[rows]) if rows else None
        self._account_stats(chunks, meta)
        outs: list[StepOutput] = []
        li = 0
        for c in chunks:
            seq = c.seq
            seq.num_computed += c.length
            if not c.samples:
                continue
            tok = sample(logits[li], seq.params, seq.generator)
            li += 1
            seq.output_ids.append(tok)
            if seq.first_token is None:
                seq.first_token = time.perf_counter()
            self._check_stop(seq)
            if seq.finished:
                seq.finish_time = time.perf_counter()
                self.scheduler.finish(seq)
            outs.append(StepOutput(seq.request_id, [tok], seq.finished, seq.finish_reason))
        return outs

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
