"""Kernel tests: on a machine without CUDA the Triton kernels run in the interpreter.

TRITON_INTERPRET must be set before triton is imported (``triton.jit`` reads it when a kernel is
defined), so this runs at conftest import, before any test module of this folder is collected.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from kernels.testing import paged_case as _paged_case


@pytest.fixture
def paged_case():
    """Factory of a paged MSA input as a dict (``kernels.testing.paged_case(...).as_dict()``): q, q_idx,
    k_cache, v_cache, k_idx_cache, page_table, cu_seqlens_q, seq_lens_kv."""
    def make(q_lens, kv_lens, **kwargs):
        return _paged_case(q_lens, kv_lens, **kwargs).as_dict()

    return make
