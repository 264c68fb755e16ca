"""`sparsify`: give a dense GQA checkpoint an MSA indexer by KL alignment (frozen backbone)."""
from engine.sparsify.config import SparsifyConfig
from engine.sparsify.trainer import sparsify

__all__ = ["SparsifyConfig", "sparsify"]
