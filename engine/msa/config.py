"""Typed MSA configuration (the `msa` section of a model config / of an adapter).

One object for every knob of MiniMax Sparse Attention on a GQA model (msa-spec sections 1-2):
block size B (== the KV cache page size), top-k blocks per query and KV group (the own block
included), index head dim d_idx, the layers that stay dense, and whether the index q/k heads
carry a learned RMSNorm. Unknown keys are errors.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from engine.config import ModelConfig
from engine.errors import EngineError, UnsupportedModelError

BLOCK_SIZES = (64, 128)  # page size == block size; the kernels take these two
TOPK_CHOICES = (4, 8, 16, 32)
D_IDX_CHOICES = (16, 32, 64, 128, 256)
HEAD_DIMS = (64, 128)  # the sparse attention kernels' head dims


class MSAConfigError(EngineError):
    """An MSA setting that cannot work (bad value, or a mismatch with the model or the cache)."""


@dataclass(frozen=True)
class MSAConfig:
    block_size: int = 128
    topk: int = 16
    d_idx: int = 64
    dense_layers: tuple[int, ...] = (0, 1)
    index_norm: bool = False  # learned RMSNorm (weight w, applied as x_hat * w) on index q and k heads

    def __post_init__(self) -> None:
        object.__setattr__(self, "dense_layers", tuple(sorted({int(i) for i in self.dense_layers})))
        if self.block_size not in BLOCK_SIZES:
            raise MSAConfigError(f"MSA block size {self.block_size} is not supported: use one of {BLOCK_SIZES}")
        if self.topk not in TOPK_CHOICES:
            raise MSAConfigError(f"MSA top-k {self.topk} is not supported: use one of {TOPK_CHOICES}")
        if self.d_idx not in D_IDX_CHOICES:
            raise MSAConfigError(f"index head dim d_idx={self.d_idx} is not supported: use one of {D_IDX_CHOICES}")

    @property
    def keys_per_query(self) -> int:
        return self.block_size * self.topk

    def msa_layers(self, num_layers: int) -> tuple[int, ...]:
        return tuple(i for i in range(num_layers) if i not in self.dense_layers)

    def check_model(self, cfg: ModelConfig) -> None:
        """Raise a one-line error when this model cannot run MSA with these settings."""
        bad = [i for i in self.dense_layers if not 0 <= i < cfg.num_layers]
        if bad:
            raise MSAConfigError(f"dense layers {bad} are out of range: the model has {cfg.num_layers} layers (0.."
                                 f"{cfg.num_layers - 1})")
        if not self.msa_layers(cfg.num_layers):
            raise MSAConfigError("every layer is listed as dense: leave at least one MSA layer")
        if cfg.num_heads % cfg.num_kv_heads or not 1 <= cfg.group_size <= 16 or not 1 <= cfg.num_kv_heads <= 16:
            raise UnsupportedModelError(
                f"MSA needs GQA with 1..16 KV heads and 1..16 query heads per KV head; this model has "
                f"{cfg.num_heads} query / {cfg.num_kv_heads} KV heads: use a GQA checkpoint")
        if cfg.head_dim not in HEAD_DIMS:
            raise UnsupportedModelError(f"MSA attention runs head dims {HEAD_DIMS}; this model has {cfg.head_dim}: "
                                        "use a model with head dim 64 or 128")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dense_layers"] = list(self.dense_layers)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> MSAConfig:
        known = {f.name for f in fields(MSAConfig)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise MSAConfigError(f"unknown MSA config keys {unknown}: the known keys are {sorted(known)}")
        return MSAConfig(**d)

    def replace(self, **overrides: Any) -> MSAConfig:
        d = self.to_dict()
        d.update({k: v for k, v in overrides.items() if v is not None})
        return MSAConfig.from_dict(d)


def default_dense_layers(num_layers: int) -> tuple[int, ...]:
    """The first two layers stay dense (they attend broadly; M3 keeps its first layers dense too)."""
    return (0, 1) if num_layers >= 8 else (0,) if num_layers >= 2 else ()
