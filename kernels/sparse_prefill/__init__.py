"""MSA sparse prefill attention over the paged KV cache (see README.md).

``msa_prefill_attention`` is the public op (Triton on CUDA, torch reference on CPU); ``plan_prefill``
decides which kernels run (``TileConfig`` overrides it) and ``launch.launch`` runs a plan (the
benchmarks' entry point); ``naive`` holds the fp32 torch reference, which serves decode (q_len 1..16)
as well.
"""
from kernels.sparse_prefill.op import msa_prefill_attention
from kernels.sparse_prefill.plan import PrefillPlan, PrefillShape, TileConfig, plan_prefill

__all__ = ["msa_prefill_attention", "plan_prefill", "PrefillPlan", "PrefillShape", "TileConfig"]
