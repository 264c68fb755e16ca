"""The attention kinds, written once. Every command-line choice, config field and check derives
from `AttentionKind`; `engine.attention.make_attention` turns a kind into the object the layers call.

- `dense`: paged GQA attention over every key.
- `msa`: MiniMax Sparse Attention through our kernels (Triton on a GPU; on a CPU `cpu_indexer`
  selects and the block-sparse `msa_cpu` attends).
- `msa-ref`: MSA through the kernels' torch references on any device (for checking).
- `msa-oracle`: MSA's block budget chosen by the true attention mass (`engine.attention.oracle`): the
  best any indexer could do with the same blocks.

Adding a kind: one name here and one branch in `make_attention`.
"""
from __future__ import annotations

from typing import Literal, get_args

from engine.errors import EngineError

AttentionKind = Literal["dense", "msa", "msa-ref", "msa-oracle"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)


def check_kind(kind: str) -> AttentionKind:
    """`kind` itself when it is an attention kind, else one `EngineError` line listing them."""
    if kind not in ATTENTION_KINDS:
        raise EngineError(f"unknown attention '{kind}': use one of {', '.join(ATTENTION_KINDS)}")
    return kind  # type: ignore[return-value]


def uses_indexer(kind: AttentionKind) -> bool:
    """Whether the kind is MSA (it needs an indexer: an adapter or the model's own; the oracle takes its block
    size, top-k and dense layers)."""
    return kind != "dense"
