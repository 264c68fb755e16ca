"""One-step-late decode: launch step n+1 before step n's tokens reach the host.

vLLM's async scheduling is the anchor. A greedy decode step is launched and left in flight; at the
next `LLMEngine.step()` the engine first launches the follow-up step, whose input ids are the
in-flight step's sampled tokens read on the device (`src_row`), and only then waits for the
in-flight tokens (a pinned-memory copy behind an event) and applies them: append, stop checks,
finishing. The host work of one step thus overlaps the GPU work of the next.

Exactness: the follow-up is what the scheduler would schedule if no request stopped on a token:
every running request is in the in-flight step, none waits for admission (unless the batch is
full), and a request whose in-flight token reaches `max_tokens` / its length limit is left out
(known in advance). A request that stops on EOS, a stop id or a stop string is already in the
follow-up: that row's token is dropped when it completes (the request is finished by then), so
the returned tokens are exactly those of the synchronous path. The K/V it wrote go to the
request's released pages, before any later step on the same stream reuses them.

On a GPU the launcher is `DecodeGraphRunner.launch` (CUDA graphs on). `EagerDecodeLauncher` runs
the same bookkeeping on the eager path, tokens ready at once: used on the CPU by the tests of
this logic; by default the CPU and graphs-off paths stay synchronous.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.scheduler import ScheduledChunk, Scheduler
from engine.sequence import Sequence


@dataclass
class DecodeRow:
    seq: Sequence
    position: int  # index of the token this step feeds (its K/V are written there)
    src_row: int = -1  # row of the in-flight step whose sampled token is fed; -1: the token is known


class Pending(Protocol):
    stats: dict

    def result(self) -> list[int]: ...


@dataclass
class ReadyTokens:
    tokens: list[int]
    stats: dict = field(default_factory=dict)

    def result(self) -> list[int]:
        return self.tokens


@dataclass
class InflightDecode:
    rows: list[DecodeRow]
    pending: Pending


def is_greedy_decode(chunks: list[ScheduledChunk]) -> bool:
    """Every chunk feeds one token, samples, and samples greedily: a step that may run one step late."""
    return all(c.length == 1 and c.samples and c.seq.params.temperature == 0.0 for c in chunks)


def follow_up_rows(prev: InflightDecode, scheduler: Scheduler) -> list[DecodeRow] | None:
    """The decode rows that follow the in-flight step `prev`, or None when the scheduler's next choice
    could differ from them (a running request outside `prev`, one waiting for admission, none left)."""
    rows, live = [], 0
    for i, r in enumerate(prev.rows):
        seq = r.seq
        if seq.finished:  # stopped on the previous completion, or aborted
            continue
        live += 1
        if len(seq.output_ids) + 1 >= seq.params.max_tokens or seq.total_len + 1 >= seq.max_len:
            continue  # the in-flight token ends it by length
        rows.append(DecodeRow(seq, r.position + 1, i))
    if live != len(scheduler.running) or not rows:
        return None
    if scheduler.waiting and len(rows) < scheduler.cfg.max_num_seqs:
        return None
    return rows


class EagerDecodeLauncher:
    """Runs a one-step-late decode step on the engine's eager path (no graph); tokens are ready at once."""

    def __init__(self, engine):
        self.engine = engine
        self.last: list[int] = []

    @torch.inference_mode()
    def launch(self, rows: list[DecodeRow]) -> ReadyTokens:
        eng = self.engine
        ids = [self.last[r.src_row] if r.src_row >= 0 else eng._tokens(r.seq, r.position, r.position + 1)[0]
               for r in rows]
        chunks = [ScheduledChunk(r.seq, r.position, 1) for r in rows]
        logits, meta = eng._eager_logits(chunks, torch.tensor(ids, device=eng.device))
        self.last = logits.argmax(dim=-1).tolist()
        return ReadyTokens(self.last, meta.stats)
