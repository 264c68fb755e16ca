"""Attention behind one dispatch point: `make_attention(kind, ...)` returns the object every
layer calls. Kinds: `dense` (paged GQA attention, SDPA on the CPU), `msa` (MSA through the
Triton kernels on a GPU, the torch references on the CPU), `msa-ref` (always the references).
"""
from engine.attention.meta import AttentionMeta
from engine.attention.dense import DenseAttention

ATTENTION_KINDS = ("dense", "msa", "msa-ref")

__all__ = ["ATTENTION_KINDS", "AttentionMeta", "DenseAttention"]
