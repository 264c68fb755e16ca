"""MSA paged decode: indexer, sparse attention and a dense baseline (torch references + Triton).

``MSADecodePlan`` / ``DenseDecodePlan`` (plan/run, CUDA-graph ready) make every choice; the plain
functions build a one-step plan. ``naive`` holds the fp32 references. See README.md in this folder.
"""
from kernels._common.int8 import dequantized_int8_queries, quantize_int8_rows

from . import naive
from .fp8 import dequantized_index_queries, quantize_index_keys
from .naive import decode_indexer_ref, dense_decode_attention_ref, sparse_decode_attention_ref
from .op import dense_decode_attention, msa_decode_attention, msa_decode_indexer
from .plan import AttentionLaunch, DecodeTuning, DenseDecodePlan, IndexerLaunch, MSADecodePlan

__all__ = [
    "AttentionLaunch",
    "DecodeTuning",
    "DenseDecodePlan",
    "IndexerLaunch",
    "MSADecodePlan",
    "decode_indexer_ref",
    "dense_decode_attention",
    "dense_decode_attention_ref",
    "dequantized_index_queries",
    "dequantized_int8_queries",
    "msa_decode_attention",
    "msa_decode_indexer",
    "naive",
    "quantize_index_keys",
    "quantize_int8_rows",
    "sparse_decode_attention_ref",
]
