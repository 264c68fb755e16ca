"""MSA sparse prefill attention over the paged KV cache (see README.md).

``msa_prefill_attention`` is the public op (Triton on CUDA, torch reference on CPU); ``naive``
holds the fp32 torch reference, which serves decode (q_len 1..16) as well.
"""
from kernels.sparse_prefill.op import msa_prefill_attention

__all__ = ["msa_prefill_attention"]
