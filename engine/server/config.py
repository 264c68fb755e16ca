"""Typed configuration of `msa-eval serve` and `python -m engine.server` (both command lines are built
from these fields and defaults, the attention choices from `engine.attention.kinds`; `create_app`
consumes it). The engine settings that used to be environment variables are fields here, filled
by the command line (which reads the variables)."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.attention.kinds import AttentionKind
from engine.server.reasoning import REASONING_PARSERS, ReasoningParser

KV_CACHE_DTYPES = ("auto", "bf16", "fp8", "fp8-hadamard")  # kernels._common.fp8.KV_DTYPES (that module loads torch)


@dataclass(frozen=True)
class ServerConfig:
    model: str = "smollm2-135m"
    attention: AttentionKind = "dense"
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 16  # engine max_num_seqs: requests decoded together
    max_queue: int = 64  # admitted requests beyond max_batch before answering 429
    max_model_len: int | None = None
    device: str | None = None
    dtype: str | None = None
    served_model_names: tuple[str, ...] = field(default_factory=tuple)  # extra names accepted in `model`
    max_body_bytes: int | None = None  # request-body cap; None: derived from the context length (bodylimit)
    weights: str | None = None  # CPU weight mode (LLM weights); None: fp32
    kv_cache_tokens: int | None = None  # None: sized by the engine
    dequant_cache: bool = True  # keep a GGUF's dequantized weights for the next load
    tensor_parallel_size: int = 1  # engine processes the model runs over (engine.parallel)
    kv_cache_dtype: str = "auto"  # K/V storage (engine.kv_fp8): auto, bf16, fp8
    reasoning_parser: ReasoningParser = "auto"  # <think> blocks -> reasoning_content: auto = when the template has them
    msa_topk: int | None = None  # MSA arms: blocks each query reads (engine msa_overrides topk); None: the model's
    default_max_tokens: int = 4096  # tokens generated when a request names no max_tokens (capped by the context)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 0:
            raise ValueError(f"max_batch must be >= 1 and max_queue >= 0, got {self.max_batch} and {self.max_queue}")
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        if self.msa_topk is not None and (isinstance(self.msa_topk, bool) or self.msa_topk < 1):
            raise ValueError(f"msa_topk must be >= 1, got {self.msa_topk}")
        if isinstance(self.default_max_tokens, bool) or self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")

    def llm_kwargs(self) -> dict:
        """The `engine.LLM` keywords of this server."""
        return dict(model=self.model, attention=self.attention, device=self.device, dtype=self.dtype,
                    max_model_len=self.max_model_len, max_num_seqs=self.max_batch, weights=self.weights,
                    kv_cache_tokens=self.kv_cache_tokens, dequant_cache=self.dequant_cache,
                    tensor_parallel_size=self.tensor_parallel_size, kv_cache_dtype=self.kv_cache_dtype,
                    msa_overrides={"topk": self.msa_topk} if self.msa_topk is not None else None)
