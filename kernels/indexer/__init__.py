"""MSA indexer: token score, block max-pool and top-k block selection (see README.md).

``msa_indexer`` is the public op (paged inference form, Triton on CUDA, torch reference on CPU);
``naive`` holds the fp32 torch references, including the contiguous varlen training form.
"""
from kernels.indexer.op import msa_indexer

__all__ = ["msa_indexer"]
