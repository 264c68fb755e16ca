"""MSA paged decode: indexer, sparse attention and a dense baseline (torch references + Triton).

See README.md in this folder for the math, shapes, invariants and the plan/run lifecycle.
"""
from .fp8 import quantize_index_keys
from .naive import decode_indexer_ref, dense_decode_attention_ref, sparse_decode_attention_ref
from .ops import dense_decode_attention, msa_decode_attention, msa_decode_indexer
from .plan import DenseDecodePlan, MSADecodePlan

__all__ = [
    "DenseDecodePlan",
    "MSADecodePlan",
    "decode_indexer_ref",
    "dense_decode_attention",
    "dense_decode_attention_ref",
    "msa_decode_attention",
    "msa_decode_indexer",
    "quantize_index_keys",
    "sparse_decode_attention_ref",
]
