"""MiniMax Sparse Attention on a dense GQA model: the typed `msa` config, the index projections,
adapters (trained projections of one base model) and the attention-mass recall measure."""
from engine.msa.adapter import Adapter, AdapterError, base_fingerprint, load_adapter, save_adapter
from engine.msa.config import MSAConfig, MSAConfigError
from engine.msa.projections import IndexProjections, IndexRope

__all__ = ["Adapter", "AdapterError", "IndexProjections", "IndexRope", "MSAConfig", "MSAConfigError",
           "base_fingerprint", "load_adapter", "save_adapter"]
