"""Continuous batching with chunked prefill.

Each step takes every running request's next decode token first, then fills the remaining
token budget with prefill chunks (FIFO). A request is admitted only when the cache can hold
its whole context (prompt + generation budget, capped at the model's limit), so running
requests never need preemption; one that could never fit is refused at admission.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.errors import ContextTooLongError
from engine.kv_cache import BlockManager
from engine.sequence import Sequence


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048


@dataclass
class ScheduledChunk:
    seq: Sequence
    start: int  # first token index (into seq.all_ids) computed this step
    length: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a token is sampled."""
        return self.start + self.length == self.seq.total_len


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager):
        self.cfg, self.blocks = cfg, blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        need = -(-seq.max_len // self.blocks.page_size)
        if need > self.blocks.num_pages:
            cap = self.blocks.num_pages * self.blocks.page_size
            raise ContextTooLongError(
                f"request needs {seq.max_len} tokens of KV cache but the cache holds {cap}: "
                "raise kv_cache_tokens or shorten the prompt/max_tokens", limit=cap, length=seq.max_len)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if not self.blocks.can_grow(seq.request_id, seq.max_len):
                break
            self.blocks.grow(seq.request_id, seq.max_len)
            self.running.append(self.waiting.popleft())

    def schedule(self) -> list[ScheduledChunk]:
        self._admit()
        budget = self.cfg.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        for seq in self.running:  # decode tokens first
            if seq.num_computed >= len(seq.prompt_ids) and seq.pending == 1:
                chunks.append(ScheduledChunk(seq, seq.num_computed, 1))
                budget -= 1
        for seq in self.running:  # then prefill chunks
            if budget <= 0:
                break
            if seq.num_computed < len(seq.prompt_ids):
                n = min(seq.pending, budget)
                chunks.append(ScheduledChunk(seq, seq.num_computed, n))
                budget -= n
        return chunks

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.request_id)

    def abort(self, request_id: str) -> Sequence | None:
        for seq in list(self.waiting):
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self.finish(seq)
                return seq
        return None
