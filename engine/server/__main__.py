"""`python -m engine.server`: the server without the msa-eval CLI (machines that have only the
engine's dependencies, e.g. the GPU device). Same options as `msa-eval serve`: their defaults are
`ServerConfig`'s, the attention choices `engine.attention.kinds`'; the engine settings read the same
environment variables here, at the edge."""
from __future__ import annotations

import argparse
import os

from engine.attention.kinds import ATTENTION_KINDS
from engine.server.config import KV_CACHE_DTYPES, ServerConfig
from engine.server.reasoning import REASONING_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def parse_args(argv: list[str] | None = None) -> tuple[ServerConfig, str]:
    from engine.cpu_weights import WEIGHT_MODES

    d = ServerConfig()
    ap = argparse.ArgumentParser(prog="python -m engine.server", description=__doc__.splitlines()[0])
    ap.add_argument("--model", "-m", default=d.model)
    ap.add_argument("--attention", default=d.attention, choices=ATTENTION_KINDS)
    ap.add_argument("--host", default=d.host)
    ap.add_argument("--port", type=int, default=d.port)
    ap.add_argument("--max-batch", type=int, default=d.max_batch)
    ap.add_argument("--max-queue", type=int, default=d.max_queue)
    ap.add_argument("--max-model-len", type=int, default=d.max_model_len)
    ap.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    ap.add_argument("--device", default=d.device)
    ap.add_argument("--served-model-name", dest="served_model_names", action="append", default=[],
                    help="extra name accepted in the request's `model` field (repeatable)")
    ap.add_argument("--weights", choices=WEIGHT_MODES, default=os.environ.get("MSA_EVAL_WEIGHTS") or d.weights)
    ap.add_argument("--kv-cache-tokens", type=int, default=int(os.environ.get("MSA_EVAL_KV_TOKENS") or 0) or None)
    ap.add_argument("--no-dequant-cache", action="store_true",
                    default=bool(os.environ.get("MSA_EVAL_NO_DEQUANT_CACHE")))
    ap.add_argument("--reasoning-parser", choices=REASONING_PARSERS,
                    default=os.environ.get("MSA_EVAL_REASONING_PARSER") or d.reasoning_parser,
                    help="<think> blocks -> reasoning_content: auto (when the chat template has them), think, none")
    ap.add_argument("--tensor-parallel-size", type=int, default=d.tensor_parallel_size)
    ap.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
                    default=os.environ.get("MSA_EVAL_KV_CACHE_DTYPE") or d.kv_cache_dtype,
                    help="K/V cache storage: auto (the model dtype), bf16, fp8 (e4m3 + fp32 scales; compute "
                         "capability >= 8.9), fp8-hadamard (fp8 with q and K rotated after RoPE)")
    ap.add_argument("--msa-topk", type=int, default=d.msa_topk,
                    help="MSA arms: blocks of keys each query reads (default: the model's indexer setting)")
    ap.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens,
                    help="tokens generated when a request gives no max_tokens / max_completion_tokens "
                         "(capped by the context)")
    ap.add_argument("--log-level", default="warning", choices=LOG_LEVELS)
    a = ap.parse_args(argv)
    config = ServerConfig(model=a.model, attention=a.attention, host=a.host, port=a.port, max_batch=a.max_batch,
                          max_queue=a.max_queue, max_model_len=a.max_model_len, device=a.device,
                          served_model_names=tuple(a.served_model_names), max_body_bytes=a.max_body_bytes,
                          weights=a.weights, kv_cache_tokens=a.kv_cache_tokens, dequant_cache=not a.no_dequant_cache,
                          reasoning_parser=a.reasoning_parser, tensor_parallel_size=a.tensor_parallel_size,
                          kv_cache_dtype=a.kv_cache_dtype, msa_topk=a.msa_topk, default_max_tokens=a.default_max_tokens)
    return config, a.log_level


def main() -> None:
    import uvicorn

    from engine.server.app import create_app

    config, log_level = parse_args()
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=log_level,
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
