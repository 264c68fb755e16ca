"""Test helpers for the MSA kernels: random paged inputs and one output comparison.

``paged_case`` builds a packed batch over a scattered paged cache (logical page order is not the
physical order); ``decode_case`` is the same with one query length for every request.
``assert_close(name, ref, out)`` compares a kernel's output with its reference: floats by relative
RMS error, top-k ids by structure and near-ties. Used by ``tests/kernels`` and the kernel benchmarks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

POISON_KEY = 1.0e4  # index-key value of poisoned pages: with positive queries it wins every top-k


@dataclass
class PagedCase:
    """One packed batch of R requests, T = sum of the query lengths, B tokens per page."""

    q: torch.Tensor  # [T, Hq, d]
    q_idx: torch.Tensor  # [T, Hkv, d_idx]
    k_cache: torch.Tensor  # [P, Hkv, B, d]
    v_cache: torch.Tensor  # [P, Hkv, B, d]
    k_idx_cache: torch.Tensor  # [P, B, d_idx]
    page_table: torch.Tensor  # int32 [R, max_pages]: distinct physical pages
    cu_seqlens_q: torch.Tensor  # int32 [R + 1]
    seq_lens: torch.Tensor  # int32 [R]: KV lengths including the new tokens
    q_len: int | None  # the common query length (decode cases), None when the lengths differ

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The tensors under the prefill ops' argument names (``seq_lens_kv`` for ``seq_lens``)."""
        return dict(q=self.q, q_idx=self.q_idx, k_cache=self.k_cache, v_cache=self.v_cache,
                    k_idx_cache=self.k_idx_cache, page_table=self.page_table, cu_seqlens_q=self.cu_seqlens_q,
                    seq_lens_kv=self.seq_lens)


def make_page_table(n_req: int, max_pages: int, num_pages: int, gen: torch.Generator) -> torch.Tensor:
    """int32 ``[n_req, max_pages]`` of distinct physical pages drawn at random from ``num_pages``."""
    perm = torch.randperm(num_pages, generator=gen)[: n_req * max_pages]
    return perm.view(n_req, max_pages).to(torch.int32)


def paged_case(q_lens: list[int], kv_lens: list[int], *, hkv: int = 2, group: int = 3, d: int = 64,
               block: int = 64, d_idx: int = 64, dtype: torch.dtype = torch.bfloat16,
               device: str | torch.device = "cpu", seed: int = 0, max_pages: int | None = None,
               num_pages: int | None = None, poison: bool = False) -> PagedCase:
    """Random N(0, 1) inputs (drawn on ``device``: a CUDA case is not a CPU case moved); the page table
    has ``max_pages`` columns (default: the longest request's pages + 1) of distinct pages out of
    ``num_pages`` (default ``2 * R * max_pages + 3``).

    ``poison=True`` makes every unread value fatal: K/V of pages no request uses and of the tokens at
    or past ``seq_len`` are NaN (an unmasked read turns the output NaN); index keys of the unused pages
    and of each request's last page (the own page of its last query, never a candidate) are
    ``POISON_KEY`` while ``q_idx`` is made positive, so any read of them wins the top-k.
    """
    gen = torch.Generator().manual_seed(seed)
    n_req = len(q_lens)
    need = [-(-n // block) for n in kv_lens]
    max_pages = max_pages or max(need) + 1
    num_pages = num_pages or 2 * n_req * max_pages + 3
    page_table = make_page_table(n_req, max_pages, num_pages, gen)
    cu = torch.zeros(n_req + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    dev = torch.device(device)
    if dev.type == "cuda":  # large caches: draw the values where they live
        gen = torch.Generator(device=dev).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=gen.device).to(dtype).to(dev)

    t = sum(q_lens)
    q, q_idx = rnd(t, hkv * group, d), rnd(t, hkv, d_idx)
    k_cache, v_cache = rnd(num_pages, hkv, block, d), rnd(num_pages, hkv, block, d)
    k_idx = rnd(num_pages, block, d_idx)
    if poison:
        q_idx = q_idx.abs()
        used = torch.zeros(num_pages, dtype=torch.bool)
        for r, n in enumerate(need):
            used[page_table[r, :n].long()] = True
            last = int(page_table[r, n - 1])
            k_cache[last, :, kv_lens[r] - (n - 1) * block:] = float("nan")
            v_cache[last, :, kv_lens[r] - (n - 1) * block:] = float("nan")
            k_idx[last] = POISON_KEY
        unused = (~used).nonzero()[:, 0].to(dev)
        k_cache[unused] = float("nan")
        v_cache[unused] = float("nan")
        k_idx[unused] = POISON_KEY
    uniform = q_lens[0] if len(set(q_lens)) == 1 else None
    return PagedCase(q, q_idx, k_cache, v_cache, k_idx, page_table.to(dev), cu.to(dev),
                     torch.tensor(kv_lens, dtype=torch.int32, device=dev), uniform)


def decode_case(seq_lens: list[int], q_len: int, **kwargs) -> PagedCase:
    """``paged_case`` with ``q_len`` new tokens per request (``seq_lens`` include them)."""
    return paged_case([q_len] * len(seq_lens), seq_lens, **kwargs)


def random_topk_ids(seq_lens: list[int], q_len: int, page: int, hkv: int, topk: int, seed: int = 0,
                    empty_rows: int = 0) -> torch.Tensor:
    """Valid random decode selections int32 ``[R*q_len, Hkv, topk]``: min(topk, own+1) distinct pages in
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


def assert_close(name: str, ref: torch.Tensor, out: torch.Tensor, ratio: float = 1e-2, *,
                 atol: float | None = None, scores: torch.Tensor | None = None, tie_tol: float = 1e-3,
                 max_differ: float = 0.05) -> None:
    """Assert that a kernel's ``out`` matches the reference ``ref``; the message names ``name``.

    Floats: NaN in ``out`` fails first (an unwritten, NaN-poisoned element); then the non-finite
    entries must be the same as ``ref``'s (-inf LSE where nothing is visible); over the finite ones the
    relative RMS error ``||out - ref|| / ||ref||`` must be <= ``ratio`` and, given ``atol``, the max
    absolute error <= ``atol``. The message carries both numbers.

    Integer top-k ids ``[T, H, k]`` (valid prefix, then -1): ``out`` must keep the structure (a valid
    prefix, distinct ids, the same valid count and last id as ``ref``, history ids below the last one);
    without ``scores`` it must equal ``ref``; with the block ``scores [T, H, n_blocks]`` a row may pick
    other blocks only where each differing block scores within ``tie_tol`` of the reference's lowest
    chosen score (a floating-point near-tie), and at most ``max_differ`` of the rows may differ.
    """
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.is_floating_point():
        _assert_float_close(name, ref, out, ratio, atol)
    else:
        _assert_selection_close(name, ref, out, scores, tie_tol, max_differ)


def _assert_float_close(name, ref, out, ratio, atol):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    n_nan = int(torch.isnan(out).sum())
    assert n_nan == 0, f"{name}: {n_nan} NaN in the output (an unwritten element or a poisoned read)"
    fin = torch.isfinite(ref)
    assert torch.equal(out[~fin], ref[~fin]) and torch.isfinite(out[fin]).all(), \
        f"{name}: non-finite entries differ from the reference's ({int((~fin).sum())} there)"
    diff = out[fin] - ref[fin]
    rel = (diff.norm() / ref[fin].norm().clamp(min=1e-30)).item()
    worst = diff.abs().max().item() if diff.numel() else 0.0
    msg = f"{name}: relative RMS error {rel:.3e} (limit {ratio:.1e}), max abs error {worst:.3e}"
    assert rel <= ratio, msg
    assert atol is None or worst <= atol, f"{msg} (limit {atol:.1e})"


def _assert_selection_close(name, ref, out, scores, tie_tol, max_differ):
    out, ref = out.detach().long().cpu(), ref.detach().long().cpu()
    k = out.shape[-1]
    valid = out >= 0
    assert (out >= -1).all(), f"{name}: ids below -1 (padding must be exactly -1)"
    assert not (~valid[..., :-1] & valid[..., 1:]).any(), f"{name}: a -1 before a valid id (valid prefix, then -1)"
    n_out, n_ref = valid.sum(-1), (ref >= 0).sum(-1)
    assert torch.equal(n_out, n_ref), f"{name}: {int((n_out != n_ref).sum())} rows have another valid count"
    last = (n_ref - 1).clamp(min=0)[..., None]
    own = out.gather(-1, last)
    assert torch.equal(own, ref.gather(-1, last)), f"{name}: the last valid id (own block) differs"
    srt = out.sort(-1).values
    assert not ((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)).any(), f"{name}: an id repeats within a row"
    hist = torch.arange(k) < (n_out - 1)[..., None]
    assert (out < own)[hist].all(), f"{name}: a history id is not below the row's own block"
    if scores is None:
        assert torch.equal(out, ref), f"{name}: {int((out != ref).any(-1).sum())} rows differ from the reference"
        return
    scores = scores.detach().float().cpu()
    differ = (srt != ref.sort(-1).values).any(-1)
    for t, h in differ.nonzero().tolist():
        n = int(n_ref[t, h]) - 1
        got, want = set(out[t, h, :n].tolist()), set(ref[t, h, :n].tolist())
        threshold = min(scores[t, h, b].item() for b in want)
        for b in got ^ want:
            gap = abs(scores[t, h, b].item() - threshold)
            assert gap <= tie_tol, (f"{name}: token {t} head {h}: block {b} is {gap:.3e} from the selection "
                                    f"threshold {threshold:.4g}, no near-tie (tolerance {tie_tol:.1e})")
    frac = differ.float().mean().item()
    assert frac <= max_differ, f"{name}: {frac:.2%} of rows differ on near-ties (limit {max_differ:.0%})"
