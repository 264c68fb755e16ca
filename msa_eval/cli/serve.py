"""`msa-eval serve`: the local engine behind an OpenAI-compatible HTTP API."""
from __future__ import annotations

import click

from engine.attention.kinds import AttentionKind
from engine.server.config import ServerConfig
from engine.server.reasoning import REASONING_PARSERS
from msa_eval.cli.options import attention_option, engine_options
from msa_eval.errors import MsaEvalError

_D = ServerConfig()  # the defaults, shared with `python -m engine.server`


@click.command("serve")
@click.option("--model", "-m", default=_D.model, show_default=True,
              help="Built-in model name, HF directory or .gguf path.")
@attention_option(_D.attention)
@click.option("--host", default=_D.host, show_default=True, help="Bind address (keep 127.0.0.1 unless you mean it).")
@click.option("--port", default=_D.port, show_default=True, type=int)
@click.option("--max-batch", default=_D.max_batch, show_default=True, type=int,
              help="Requests decoded together (engine max_num_seqs).")
@click.option("--max-queue", default=_D.max_queue, show_default=True, type=int,
              help="Requests admitted beyond --max-batch before the server answers 429.")
@click.option("--max-model-len", default=_D.max_model_len, type=int, help="Context limit (default: the model's).")
@click.option("--max-body-bytes", default=_D.max_body_bytes, type=int,
              help="Largest request body accepted (default: 64 bytes per context token + 256 KiB).")
@click.option("--device", default=_D.device, help="cpu | cuda (default: cuda when available).")
@click.option("--served-model-name", "served_names", multiple=True,
              help="Extra name accepted in the request's `model` field (repeatable).")
@engine_options
@click.option("--reasoning-parser", default=_D.reasoning_parser, show_default=True, envvar="MSA_EVAL_REASONING_PARSER",
              type=click.Choice(REASONING_PARSERS),
              help="<think> blocks -> reasoning_content: auto (when the chat template has them), think, none.")
@click.option("--msa-topk", type=int, default=_D.msa_topk,
              help="MSA arms: blocks of keys each query reads (default: the model's indexer setting; "
                   "`msa-eval run` suites set it with msa_overrides.topk).")
@click.option("--default-max-tokens", default=_D.default_max_tokens, show_default=True, type=int,
              help="Tokens generated when a request gives no max_tokens / max_completion_tokens (capped by the "
                   "context).")
@click.option("--log-level", default="warning", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(model: str, attention: AttentionKind, host: str, port: int, max_batch: int, max_queue: int,
          max_model_len: int | None, max_body_bytes: int | None, device: str | None, served_names: tuple[str, ...],
          weights: str | None, kv_cache_tokens: int | None, no_dequant_cache: bool, tensor_parallel_size: int,
          kv_cache_dtype: str, reasoning_parser: str, msa_topk: int | None, default_max_tokens: int,
          log_level: str) -> None:
    """Serve MODEL over /v1/chat/completions, /v1/completions, /v1/models, /health and /metrics."""
    import uvicorn

    from engine.errors import EngineError
    from engine.server import create_app
    from msa_eval.display import info

    try:
        config = ServerConfig(model=model, attention=attention, host=host, port=port, max_batch=max_batch,
                              max_queue=max_queue, max_model_len=max_model_len, device=device,
                              served_model_names=served_names, max_body_bytes=max_body_bytes, weights=weights,
                              kv_cache_tokens=kv_cache_tokens or None, dequant_cache=not no_dequant_cache,
                              tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype,
                              reasoning_parser=reasoning_parser, msa_topk=msa_topk,  # type: ignore[arg-type]
                              default_max_tokens=default_max_tokens)
        app = create_app(config)
    except ValueError as e:
        raise MsaEvalError(f"bad serve option: {e}") from e
    except EngineError as e:
        raise MsaEvalError(str(e)) from e
    state = app.state.serving
    kv = getattr(state.llm, "kv_dtype_name", "?")
    info(f"serving {state.model_names[0]} ({attention}, kv cache {kv}) on http://{host}:{port}/v1 "
         f"(max context {state.max_model_len}, batch {max_batch}, queue {max_queue})")
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)


if __name__ == "__main__":  # python -m msa_eval.cli.serve ... (same options)
    serve()
