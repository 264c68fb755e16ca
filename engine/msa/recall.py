"""Attention-mass recall of a block selection: the fraction of the DENSE softmax mass of each
query head that falls inside the blocks its KV group selected (1.0 = the selection misses nothing).

Reference math in fp32, one request at a time, queries in chunks (no `[T, S]` beyond a bound).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.dense import gather_kv, gather_pages
from engine.attention.meta import AttentionMeta

# fp32 elements of the largest chunk of dense probabilities or gathered keys, per device type: 64 MiB on a CPU,
# 1 GiB on a GPU (there a chunk is a launch: a long context's masses in a few large launches, not hundreds of small
# ones). The one budget of every exact reader here, the oracle selection and the selection telemetry.
CHUNK_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 28}


def chunk_elements(device: torch.device) -> int:
    """`CHUNK_ELEMENTS` of `device`'s type (the CPU's for any other)."""
    return CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cpu"])


def dense_probs(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, scale: float) -> torch.Tensor:
    """q `[Tc, Hq, d]`, k `[Hkv, S, d]`, pos `[Tc]` -> causal softmax probabilities fp32 `[Tc, Hq, S]`."""
    hq, hkv = q.shape[1], k.shape[0]
    kk = k.float().repeat_interleave(hq // hkv, 0)  # [Hq, S, d]
    s = torch.einsum("thd,hsd->ths", q.float(), kk) * scale
    vis = torch.arange(k.shape[1], device=q.device)[None, :] <= pos[:, None]
    return torch.softmax(s.masked_fill(~vis[:, None, :], float("-inf")), dim=-1)


def dense_probs_rows(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, scale: float) -> torch.Tensor:
    """`dense_probs` with keys per row: q `[n, Hq, d]`, k `[n, Hkv, S, d]` (row i's keys; those past pos[i] are
    masked, so padding may hold anything), pos `[n]` -> fp32 `[n, Hq, S]`."""
    n, hq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    sc = torch.einsum("nhgd,nhsd->nhgs", q.float().view(n, hkv, hq // hkv, d), k.float()).reshape(n, hq, s) * scale
    vis = torch.arange(s, device=q.device)[None, :] <= pos[:, None]
    return torch.softmax(sc.masked_fill(~vis[:, None, :], float("-inf")), dim=-1)


def decode_step_probs(q: torch.Tensor, k_cache: torch.Tensor, kv_lens: list[int], page_table: torch.Tensor,
                      scale: float, max_elements: int):
    """R requests of one query each (q `[R, Hq, d]`, their `kv_lens` and `page_table` rows `[R, pages]`): yields
    (r0, r1, pos, p) per chunk of requests, p the dense probabilities fp32 `[r1 - r0, Hq, S]` over each request's
    pages gathered at once (`gather_pages`; S = the longest request's pages, masked past each one's position
    pos = kv_len - 1); a chunk holds at most `max_elements` probabilities or gathered key elements."""
    r_all, hq, d = q.shape
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    pos = torch.tensor(kv_lens, device=q.device) - 1
    npg = -(-max(kv_lens) // block)
    rows = max(1, max_elements // (npg * block * max(hq, hkv * d)))
    for r0 in range(0, r_all, rows):
        r1 = min(r_all, r0 + rows)
        k = gather_pages(k_cache, page_table[r0:r1], npg)
        yield r0, r1, pos[r0:r1], dense_probs_rows(q[r0:r1], k, pos[r0:r1], scale)


@dataclass(frozen=True)
class SingleQueryRows:
    """The requests of a step with one query token each (`single_query_rows`): their indices `reqs`, lengths
    `kv_lens`, page-table rows `page_table` and their rows of the packed q, `at` (a slice when every request of
    the step is one, else an index tensor: `x[at]` takes them from q, ids or a step-sized output)."""

    reqs: list[int]
    kv_lens: list[int]
    page_table: torch.Tensor
    at: slice | torch.Tensor

    @property
    def every(self) -> bool:
        """Every request of the step has one query (a decode step): `at` is the slice of the first R rows."""
        return isinstance(self.at, slice)


def single_query_rows(meta: AttentionMeta, keep=None) -> SingleQueryRows | None:
    """The requests of a step with one query token each (decode tokens; `keep(r)` may drop some), when there are
    at least two of them (else None): the readers that score every query against its whole context (oracle
    selection, telemetry) take these in one batch, whatever else the step holds (a mixed step of prefill chunks
    and decode tokens is the common one under continuous batching)."""
    reqs, rows, start = [], [], 0
    for r, ql in enumerate(meta.q_lens):
        if ql == 1 and (keep is None or keep(r)):
            reqs.append(r)
            rows.append(start)
        start += ql
    if len(reqs) < 2:
        return None
    kv_lens = [meta.kv_lens[r] for r in reqs]
    if len(reqs) == len(meta.q_lens):
        return SingleQueryRows(reqs, kv_lens, meta.page_table, slice(0, len(reqs)))
    pt = meta.page_table
    return SingleQueryRows(reqs, kv_lens, pt[torch.as_tensor(reqs, device=pt.device)],
                           torch.as_tensor(rows, device=pt.device))


def block_mask(ids: torch.Tensor, seq_len: int, block: int, group: int) -> torch.Tensor:
    """ids `[Tc, Hkv, k]` (-1 padding) -> bool `[Tc, Hq, S]`: key j lies in a selected block of the head's group."""
    nb = -(-seq_len // block)
    sel = torch.zeros(ids.shape[0], ids.shape[1], nb + 1, dtype=torch.bool, device=ids.device)
    sel.scatter_(2, torch.where(ids >= 0, ids.long(), nb), True)
    sel = sel[..., :nb].repeat_interleave(block, dim=2)[..., :seq_len]
    return sel.repeat_interleave(group, dim=1)


def selected_mass(q: torch.Tensor, k_cache: torch.Tensor, meta: AttentionMeta, ids: torch.Tensor,
                  scale: float) -> tuple[float, int]:
    """Sum over (query token, query head) of the dense mass inside the selection, and the count."""
    hq, block = q.shape[1], k_cache.shape[2]
    group = hq // k_cache.shape[1]
    total, count, start = 0.0, 0, 0
    for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
        k = gather_kv(k_cache, meta.page_lists[r], kl)
        chunk = max(1, chunk_elements(q.device) // (hq * kl))
        for c0 in range(0, ql, chunk):
            c1 = min(ql, c0 + chunk)
            pos = kl - ql + torch.arange(c0, c1, device=q.device)
            p = dense_probs(q[start + c0:start + c1], k, pos, scale)
            m = block_mask(ids[start + c0:start + c1], kl, block, group)
            total += float((p * m).sum())
            count += (c1 - c0) * hq
        start += ql
    return total, count
