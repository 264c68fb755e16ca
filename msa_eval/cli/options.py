"""Click options that several commands share, each written once. The attention choices come from
`engine.attention.kinds` (light to import: no torch); the engine settings the library used to read
from the environment are read here, at the edge (`envvar=`), and passed down as arguments:
`MSA_EVAL_WEIGHTS` (--weights), `MSA_EVAL_KV_TOKENS` (--kv-cache-tokens),
`MSA_EVAL_NO_DEQUANT_CACHE` (--no-dequant-cache), `MSA_EVAL_KV_CACHE_DTYPE` (--kv-cache-dtype). A flag given on
the command line wins.
`--tensor-parallel-size N` runs the model over N processes that the engine launches itself (`engine.parallel`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from engine.attention.kinds import ATTENTION_KINDS
from engine.server.config import KV_CACHE_DTYPES  # torch-free: the CLI starts fast

WEIGHT_MODES = ("fp32", "bf16", "q4")  # engine.cpu_weights.WEIGHT_MODES (that module loads torch)


def attention_option(default: str = "dense", extra: tuple[str, ...] = (), help: str | None = None) -> Callable:
    """`--attention KIND`: the engine's attention kinds, after the command's own `extra` choices (`run`: both)."""
    return click.option("--attention", type=click.Choice([*extra, *ATTENTION_KINDS]), default=default,
                        show_default=True, help=help)


def parse_arms(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """One kind, a comma list of kinds (the arms, in order, on identical prompts: e.g. `dense,msa,msa-oracle`)
    or `both` (= `msa,dense`) -> a tuple of kinds, repeats dropped; ValueError naming the choices."""
    if isinstance(value, tuple):
        names = list(value)
    else:
        names = ["msa", "dense"] if value == "both" else [v.strip() for v in str(value).split(",") if v.strip()]
    bad = [n for n in names if n not in ATTENTION_KINDS]
    if bad or not names:
        raise ValueError(f"unknown attention arm {bad[0] if bad else repr(value)}: use both or a comma list of "
                         f"{', '.join(ATTENTION_KINDS)}")
    return tuple(dict.fromkeys(names))


class AttentionArms(click.ParamType):
    """`--attention` of `msa-eval run` (`parse_arms`)."""

    name = "arms"

    def convert(self, value: Any, param: Any, ctx: Any) -> tuple[str, ...]:
        try:
            return parse_arms(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def arms_option(help: str | None = None) -> Callable:
    """`--attention ARMS` (`AttentionArms`); not given (None): the suite's `attention`, else both."""
    return click.option("--attention", type=AttentionArms(), default=None,
                        help=f"{help or ''} Default: the suite's `attention` arms, else both.".strip())


def engine_options(f: Callable) -> Callable:
    """`--weights`, `--kv-cache-tokens`, `--no-dequant-cache`, `--tensor-parallel-size`, `--kv-cache-dtype`: the
    in-process engine's settings (arguments `weights`, `kv_cache_tokens`, `no_dequant_cache`, `tensor_parallel_size`,
    `kv_cache_dtype`; `engine_kwargs` turns them into `LLM` keywords)."""
    opts = [
        click.option("--weights", type=click.Choice(WEIGHT_MODES), default=None, envvar="MSA_EVAL_WEIGHTS",
                     show_envvar=True, help="CPU weight mode: fp32 (exact), bf16, or q4 (a GGUF's 4-bit codes; "
                                            "fastest). Default: fp32."),
        click.option("--kv-cache-tokens", type=click.IntRange(min=0), default=None, envvar="MSA_EVAL_KV_TOKENS",
                     show_envvar=True, help="KV cache size in tokens (default or 0: sized from free GPU memory, "
                                            "on a CPU twice the context and at least 32768)."),
        click.option("--no-dequant-cache", is_flag=True, envvar="MSA_EVAL_NO_DEQUANT_CACHE", show_envvar=True,
                     help="Do not keep a GGUF's dequantized weights under $MSA_EVAL_HOME for the next load."),
        click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Run the model over N processes launched here: KV heads and experts split across "
                          "them (GPUs: rank r on cuda:r, NCCL; CPU: gloo)."),
        click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default="auto", show_default=True,
                     envvar="MSA_EVAL_KV_CACHE_DTYPE", show_envvar=True,
                     help="K/V cache storage: auto (the model dtype; bf16 for the CPU bf16/q4 weight modes), bf16, "
                          "fp8 (e4m3 with a fp32 scale per token and KV head; GPUs of compute capability >= 8.9), or "
                          "fp8-hadamard (fp8 with q and K rotated by a Hadamard matrix after RoPE: q . k unchanged, "
                          "about a third less K rounding error)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def engine_kwargs(weights: str | None, kv_cache_tokens: int | None, no_dequant_cache: bool,
                  tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """The `LLM` keywords of the options above that were given (an unset one keeps the engine's default)."""
    kw: dict[str, Any] = {}
    if weights is not None:
        kw["weights"] = weights
    if kv_cache_tokens:
        kw["kv_cache_tokens"] = kv_cache_tokens
    if no_dequant_cache:
        kw["dequant_cache"] = False
    if tensor_parallel_size != 1:
        kw["tensor_parallel_size"] = tensor_parallel_size
    if kv_cache_dtype != "auto":  # kept out when unset: a default run's config hash stays what it was
        kw["kv_cache_dtype"] = kv_cache_dtype
    return kw
