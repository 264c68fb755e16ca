"""Typed model configuration: one object for every supported checkpoint. Llama-family decoders fill the
common fields; MiniMax-M3 also carries its own settings (`m3`, `engine.m3.settings`). `from_hf_config`
is the one place that maps a `config.json` onto a family (by `model_type`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.errors import UnsupportedModelError
from engine.m3.settings import M3_MODEL_TYPES, M3Settings, read_m3_settings, text_config

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "minimax_m3")
LLAMA_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling: kind in {"default", "linear", "llama3", "yarn"}."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position: int = 8192  # llama3 / yarn
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn mscale override

    @staticmethod
    def from_hf(d: dict[str, Any] | None, max_pos: int) -> RopeScaling:
        if not d:
            return RopeScaling()
        kind = d.get("rope_type") or d.get("type") or "default"
        if kind not in ("default", "linear", "llama3", "yarn"):
            raise UnsupportedModelError(
                f"rope scaling '{kind}' is not supported: use a checkpoint with default, linear, "
                "llama3 or yarn RoPE scaling"
            )
        return RopeScaling(
            kind=kind,
            factor=float(d.get("factor", 1.0)),
            low_freq_factor=float(d.get("low_freq_factor", 1.0)),
            high_freq_factor=float(d.get("high_freq_factor", 4.0)),
            original_max_position=int(d.get("original_max_position_embeddings", max_pos)),
            beta_fast=float(d.get("beta_fast", 32.0)),
            beta_slow=float(d.get("beta_slow", 1.0)),
            attention_factor=d.get("attention_factor"),
        )


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_embeddings: bool = False
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # qwen3: per-head RMSNorm on q and k before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    m3: M3Settings | None = None  # MiniMax-M3 only (arch "minimax_m3")

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"architecture '{self.arch}' is not supported: msa-eval runs Llama, Mistral, Qwen2, "
                "Qwen3-family GQA decoders and MiniMax-M3"
            )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"{self.num_heads} query heads are not a multiple of {self.num_kv_heads} KV heads: "
                "GQA needs Hq % Hkv == 0"
            )

    @property
    def family(self) -> str:
        """"minimax_m3" or "llama" (the Llama-family decoders)."""
        return "minimax_m3" if self.arch == "minimax_m3" else "llama"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


def from_hf_config(cfg: dict[str, Any]) -> ModelConfig:
    """Map a transformers `config.json` dict onto ModelConfig (the family from its `model_type`)."""
    archs = cfg.get("architectures") or []
    mt = cfg.get("model_type", "")
    if mt in M3_MODEL_TYPES:
        return _common(text_config(cfg), "minimax_m3")
    if mt not in LLAMA_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type '{mt}' ({', '.join(archs) or 'no architectures'}) is not supported: msa-eval runs "
            f"Llama, Mistral, Qwen2 and Qwen3-family GQA decoders ({', '.join(LLAMA_MODEL_TYPES)}) and MiniMax-M3 "
            f"({', '.join(M3_MODEL_TYPES)})"
        )
    return _common(cfg, mt)


def _common(cfg: dict[str, Any], arch: str) -> ModelConfig:
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    max_pos = int(cfg.get("max_position_embeddings", 4096))
    # transformers >= 5 writes RoPE settings under `rope_parameters`; older files at top level
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    num_layers = int(cfg["num_hidden_layers"])
    m3 = read_m3_settings(cfg, num_layers, head_dim) if arch == "minimax_m3" else None
    return ModelConfig(
        arch=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        intermediate_size=m3.dense_intermediate_size if m3 else int(cfg["intermediate_size"]),
        max_position=max_pos,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(theta),
        rope_scaling=RopeScaling.from_hf(scaling, max_pos),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=arch in ("qwen3", "minimax_m3"),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        m3=m3,
    )
