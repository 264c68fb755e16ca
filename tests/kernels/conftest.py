"""Kernel tests: on a machine without CUDA the Triton kernels run in the interpreter.

TRITON_INTERPRET must be set before triton is imported (``triton.jit`` reads it when a kernel is
defined), so this runs at conftest import, before any test module of this folder is collected.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _scattered_page_table(n_req: int, max_pages: int, generator: torch.Generator) -> tuple[torch.Tensor, int]:
    """A random non-identity page table over twice as many physical pages as needed."""
    n_pages = 2 * n_req * max_pages + 3
    perm = torch.randperm(n_pages, generator=generator)[: n_req * max_pages]
    return perm.view(n_req, max_pages).to(torch.int32), n_pages


@pytest.fixture
def paged_case():
    """Factory of a paged MSA input: ``paged_case(q_lens, kv_lens, Hkv, G, d, B, d_idx, dtype, device, seed)``.

    Returns a dict with q ``[T, Hq, d]``, q_idx ``[T, Hkv, d_idx]``, k_cache / v_cache
    ``[pages, Hkv, B, d]``, k_idx_cache ``[pages, B, d_idx]``, page_table, cu_seqlens_q, seq_lens_kv.
    Values are N(0, 1) (index tensors scaled so block scores are well separated).
    """
    def make(q_lens, kv_lens, hkv=2, group=3, d=64, block=64, d_idx=64, dtype=torch.bfloat16,
             device="cpu", seed=0):
        g = torch.Generator().manual_seed(seed)
        n_req = len(q_lens)
        max_pages = max(-(-n // block) for n in kv_lens) + 1
        page_table, n_pages = _scattered_page_table(n_req, max_pages, g)
        t = sum(q_lens)
        cu = torch.zeros(n_req + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(q_lens), 0)

        def rnd(*shape):
            return torch.randn(*shape, generator=g).to(dtype).to(device)

        return dict(
            q=rnd(t, hkv * group, d), q_idx=rnd(t, hkv, d_idx),
            k_cache=rnd(n_pages, hkv, block, d), v_cache=rnd(n_pages, hkv, block, d),
            k_idx_cache=rnd(n_pages, block, d_idx),
            page_table=page_table.to(device), cu_seqlens_q=cu.to(device),
            seq_lens_kv=torch.tensor(kv_lens, dtype=torch.int32, device=device))

    return make
