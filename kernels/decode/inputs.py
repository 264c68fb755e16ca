"""Random paged decode inputs for tests and benchmarks (scattered page tables, optional poison).

``make_decode_case`` builds one batch: every request gets ``ceil(seq_len / B)`` physical pages
drawn from a random permutation of the cache (so logical order != physical order); unused
page-table columns point at a spare page. With ``poison=True``:

* K/V tokens at or past ``seq_len`` (tail of the last page) and the spare page are NaN, so any
  unmasked read of them turns the output NaN;
* index keys of every page at or after the last query's own page, and of the spare page, are
  +1e4 while ``q_idx`` is made positive, so any read of them wins the top-k.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

POISON_KEY = 1.0e4


@dataclass
class DecodeCase:
    q: torch.Tensor  # [R*q_len, Hq, d]
    q_idx: torch.Tensor  # [R*q_len, Hkv, d_idx]
    k_cache: torch.Tensor  # [P, Hkv, B, d]
    v_cache: torch.Tensor
    k_idx_cache: torch.Tensor  # [P, B, d_idx]
    page_table: torch.Tensor  # int32 [R, max_pages]
    seq_lens: torch.Tensor  # int32 [R]
    q_len: int


def make_page_table(seq_lens: list[int], page: int, max_pages: int, num_pages: int, gen: torch.Generator):
    """Scattered int32 page table; returns (table [R, max_pages], spare page id)."""
    need = [-(-s // page) for s in seq_lens]
    perm = torch.randperm(num_pages, generator=gen)
    spare = int(perm[-1])
    table = torch.full((len(seq_lens), max_pages), spare, dtype=torch.int32)
    start = 0
    for r, n in enumerate(need):
        table[r, :n] = perm[start : start + n].to(torch.int32)
        start += n
    return table, spare


def make_decode_case(
    seq_lens: list[int], q_len: int, hq: int, hkv: int, d: int, page: int, d_idx: int, *,
    max_pages: int | None = None, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
    seed: int = 0, poison: bool = False, spare_pages: int = 2,
) -> DecodeCase:
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // page) for s in seq_lens]
    max_pages = max_pages or max(need)
    num_pages = sum(need) + spare_pages
    table, spare = make_page_table(seq_lens, page, max_pages, num_pages, gen)
    tokens = len(seq_lens) * q_len

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k_cache, v_cache = rnd(tokens, hq, d), rnd(num_pages, hkv, page, d), rnd(num_pages, hkv, page, d)
    q_idx, k_idx = rnd(tokens, hkv, d_idx), rnd(num_pages, page, d_idx)
    if poison:
        q_idx = q_idx.abs()
        k_cache[spare] = float("nan")
        v_cache[spare] = float("nan")
        k_idx[spare] = POISON_KEY
        for r, s in enumerate(seq_lens):
            last = int(table[r, need[r] - 1])
            k_cache[last, :, s - (need[r] - 1) * page :] = float("nan")
            v_cache[last, :, s - (need[r] - 1) * page :] = float("nan")
            own_last = (s - 1) // page
            for j in range(own_last, need[r]):
                k_idx[int(table[r, j])] = POISON_KEY
    dev = torch.device(device)
    return DecodeCase(
        q.to(dev), q_idx.to(dev), k_cache.to(dev), v_cache.to(dev), k_idx.to(dev),
        table.to(dev), torch.tensor(seq_lens, dtype=torch.int32, device=dev), q_len,
    )


def random_topk_ids(seq_lens: list[int], q_len: int, page: int, hkv: int, topk: int, seed: int = 0,
                    empty_rows: int = 0) -> torch.Tensor:
    """Valid random selections int32 ``[R*q_len, Hkv, topk]``: min(topk, own+1) distinct pages in
    random order, own page last, -1 padding; the first ``empty_rows`` (token, head) rows are all -1."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((len(seq_lens) * q_len, hkv, topk), -1, dtype=torch.int32)
    for r, s in enumerate(seq_lens):
        for i in range(q_len):
            own = (s - q_len + i) // page
            for h in range(hkv):
                hist = torch.randperm(own, generator=gen)[: min(topk, own + 1) - 1]
                row = torch.cat([hist, torch.tensor([own])]).to(torch.int32)
                ids[r * q_len + i, h, : row.numel()] = row
    ids.view(-1, topk)[:empty_rows] = -1
    return ids
