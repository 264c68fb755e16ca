"""MSA indexer: token score, block max-pool and top-k block selection (see README.md).

``msa_indexer`` is the public op (paged inference form, Triton on CUDA, torch reference on CPU);
``plan_indexer`` makes its choices once and ``launch`` runs a plan's other outputs (block scores,
score sums) for tests and benchmarks; ``naive`` holds the fp32 torch references, including the
contiguous varlen training form.
"""
from . import naive
from .op import launch, msa_indexer
from .plan import IndexerPlan, plan_indexer

__all__ = ["IndexerPlan", "launch", "msa_indexer", "naive", "plan_indexer"]
