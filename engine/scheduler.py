"""Continuous batching with chunked prefill.

Each step takes every running request's next decode token first, then fills the remaining
token budget with prefill chunks (FIFO). Prefill chunks of scoring requests (prompt log-probs)
together take at most `max_scored_tokens` per step: each of their rows needs a full-vocabulary
row of logits (512 x 49152 fp32 = 100 MB), and a long scoring prompt so spreads over several
steps, between other requests' decode steps, instead of holding the engine for one long step.
A request is admitted only when the cache can hold its whole context (prompt + generation
budget, capped at the model's limit), so running requests never need preemption; one that
could never fit is refused at admission.
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
    max_scored_tokens: int = 512  # prefill tokens of scoring requests per step (their logits are kept)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_scored_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"SchedulerConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class ScheduledChunk:
    seq: Sequence
    start: int  # first token index (into seq.all_ids) computed this step
    length: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a token is sampled
        (never for a score-only request, max_tokens 0)."""
        return self.start + self.length == self.seq.total_len and self.seq.params.max_tokens > 0

    @property
    def scores(self) -> bool:
        """A prefill chunk of a request that asked for prompt log-probs."""
        return self.seq.params.prompt_logprobs is not None and self.start < len(self.seq.prompt_ids)

    @property
    def scored_rows(self) -> int:
        """Rows of this chunk that score the next prompt token (the prompt's last row scores a generated one)."""
        if not self.scores:
            return 0
        return max(0, min(self.start + self.length, len(self.seq.prompt_ids) - 1) - self.start)


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
        scored = self.cfg.max_scored_tokens
        for seq in self.running:  # then prefill chunks
            if budget <= 0:
                break
            if seq.num_computed < len(seq.prompt_ids):
                n = min(seq.pending, budget)
                if seq.params.prompt_logprobs is not None:
                    n = min(n, scored)
                    if n == 0:
                        continue  # this step's scored rows are taken: it goes on next step
                    scored -= n
                chunks.append(ScheduledChunk(seq, seq.num_computed, n))
                budget -= n
        return chunks

    def finish(self, seq: Sequence) -> None:
        """Stop running `seq` and free its pages (a no-op when it is not running)."""
        if any(s is seq for s in self.running):
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
