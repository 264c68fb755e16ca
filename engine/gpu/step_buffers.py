"""The per-step inputs of the CUDA-graph decode, packed so that one host-to-device copy stages a step.

Device layout (one uint8 buffer, typed views; N = largest captured batch, W = page-table width):

* `io` int64 `[5, N]`, rows `IO_ROWS`: `src_row` (row of the previous step whose sampled token this
  row feeds, -1 = take `token`), `token` (host token id), `position`, `slot_page`, `slot_offset`;
* `seq_lens` int32 `[N]` (KV length including this step's token);
* `page_table` int32 `[N, W]` (-1 unused).

`tokens` int64 `[N]` (separate) holds the tokens the last replayed graph sampled (its argmax), which
the next step reads through `src_row` without a host round trip.

A host master copy (numpy) is edited in place: rows of real requests each step, a request's page
table only when its row changes owner (pages are allocated at admission, so they never change while
a request runs); padded rows (seq_len 1 on the scratch page) are rewritten only when they were real
rows before. `stage` copies the master into one of two pinned buffers (alternating: the copy of step
k may still be in flight while step k+1 is staged; the engine waits for step k-1 before staging k+1)
and enqueues one non-blocking copy to the device.
"""
from __future__ import annotations

import numpy as np
import torch

IO_ROWS = ("src_row", "token", "position", "slot_page", "slot_offset")


class StepBuffers:
    def __init__(self, n: int, width: int, scratch_page: int, device: torch.device):
        self.n, self.width, self.scratch_page, self.device = n, width, scratch_page, device
        nio, nlen = len(IO_ROWS) * n * 8, n * 4
        nbytes = nio + nlen + n * width * 4
        self.dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.io = self.dev[:nio].view(torch.int64).view(len(IO_ROWS), n)
        self.seq_lens = self.dev[nio:nio + nlen].view(torch.int32)
        self.page_table = self.dev[nio + nlen:].view(torch.int32).view(n, width)
        self.tokens = torch.zeros(n, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self._pinned = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self._pinned_np = [p.numpy() for p in self._pinned]
        self.master = np.zeros(nbytes, dtype=np.uint8)
        self.m_io = self.master[:nio].view(np.int64).reshape(len(IO_ROWS), n)
        self.m_lens = self.master[nio:nio + nlen].view(np.int32)
        self.m_table = self.master[nio + nlen:].view(np.int32).reshape(n, width)
        self._owner: list[tuple[object, int] | None] = [None] * n  # (pages list, its length) per row
        self._used = n  # rows that may hold real data: reset all of them to padding now
        self._pad_rows(0)
        self._k = 0

    def _pad_rows(self, start: int) -> None:
        """Rows [start, used) become padding: token 0 at position 0 on the scratch page, seq_len 1."""
        if start >= self._used:
            return
        s = slice(start, self._used)
        self.m_io[:, s] = 0
        self.m_io[0, s] = -1
        self.m_io[3, s] = self.scratch_page
        self.m_lens[s] = 1
        self.m_table[s] = -1
        self.m_table[s, 0] = self.scratch_page
        for i in range(start, self._used):
            self._owner[i] = None
        self._used = start

    def write(self, rows: list[tuple[int, int, int, int, int]], tables: list[list[int]]) -> None:
        """Fill the master: `rows[i]` = (src_row, token, position, slot_page, slot_offset) of request i,
        `tables[i]` its page ids (a list object owned by the block manager); seq_len = position + 1."""
        n = len(rows)
        if n > self.n:
            raise ValueError(f"{n} rows for step buffers of {self.n}")
        self._pad_rows(n)
        if n:
            io = np.array(rows, dtype=np.int64).T
            self.m_io[:, :n] = io
            self.m_lens[:n] = io[2] + 1
        for i, pages in enumerate(tables):
            own = self._owner[i]
            if own is None or own[0] is not pages or own[1] != len(pages):
                if len(pages) > self.width:
                    raise ValueError(f"request has {len(pages)} pages, the page table holds {self.width}")
                self.m_table[i] = -1
                self.m_table[i, :len(pages)] = pages
                self._owner[i] = (pages, len(pages))
        self._used = max(self._used, n)

    def stage(self) -> None:
        """One copy of the whole master to the device (non-blocking from pinned memory on a GPU)."""
        host = self._pinned_np[self._k]
        np.copyto(host, self.master)
        self.dev.copy_(self._pinned[self._k], non_blocking=self.device.type == "cuda")
        self._k ^= 1

    def host_views(self, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """CPU int32 views (seq_lens `[bs]`, page_table `[bs, W]`) of the master, for plan hooks."""
        return torch.from_numpy(self.m_lens[:bs]), torch.from_numpy(self.m_table[:bs])
