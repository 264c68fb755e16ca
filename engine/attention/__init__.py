"""Attention behind one dispatch point: `make_attention(kind, device, model_config, indexer)` returns
the object every layer calls (the kinds: `engine.attention.kinds`, light to import; which class runs
where: the table in `engine.attention.factory`). The classes load on first use (they need torch)."""
from engine.attention.kinds import ATTENTION_KINDS, AttentionKind, check_kind, uses_indexer

__all__ = ["ATTENTION_KINDS", "Attention", "AttentionKind", "AttentionMeta", "DenseAttention", "GpuDenseAttention",
           "Indexer", "check_kind", "make_attention", "uses_indexer"]

_LAZY = {"Attention": "engine.attention.meta", "AttentionMeta": "engine.attention.meta",
         "DenseAttention": "engine.attention.dense", "GpuDenseAttention": "engine.attention.dense",
         "Indexer": "engine.attention.factory", "make_attention": "engine.attention.factory"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine.attention' has no attribute {name!r}")
