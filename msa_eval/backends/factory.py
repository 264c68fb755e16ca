"""`make_backend(kind, **opts)`: the one place that turns a backend kind into an object.

`BACKENDS` is the kind -> "module:builder" table (the registry idiom of `msa_common.registry`);
each builder imports its implementation when called, so `msa-eval tasks` and `--dry-run` never
load torch models or HTTP clients. Construction failures become `BackendError` with one clear line.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from msa_common.registry import Registry
from msa_eval.backends.base import Backend, BackendError

BACKENDS = Registry(
    table={"local": "msa_eval.backends.factory:build_local", "openai": "msa_eval.backends.factory:build_openai"},
    unknown=lambda asked, names: BackendError(f"unknown backend {asked!r}: use one of {', '.join(names)}"),
)
KINDS = BACKENDS.names()


def make_backend(kind: str, **opts: Any) -> Backend:
    """local: model, attention, plus LocalBackend options (device, max_num_seqs, ...).
    openai: base_url, model, plus OpenAIBackendConfig fields; `token_counter` optional."""
    return BACKENDS.load(kind)(**opts)


def build_local(model: str, attention: str = "dense", **opts: Any) -> Backend:
    from engine.errors import EngineError
    from msa_eval.backends.local import LocalBackend

    try:
        return LocalBackend(model=model, attention=attention, **opts)
    except EngineError as e:
        raise BackendError(f"local backend ({model}, attention={attention}): {e}") from None


def build_openai(base_url: str | None = None, model: str | None = None, **opts: Any) -> Backend:
    from msa_eval.backends.openai_backend import OpenAIBackend, OpenAIBackendConfig

    if not base_url or not model:
        raise BackendError("the openai backend needs --base-url URL and --model ID")
    counter = opts.pop("token_counter", None)
    fields = {f.name for f in dataclasses.fields(OpenAIBackendConfig)}
    unknown = sorted(set(opts) - fields)
    if unknown:
        raise BackendError(f"unknown openai backend options {unknown}: use {sorted(fields)}")
    try:
        cfg = OpenAIBackendConfig(base_url=base_url, model=model, **opts)
    except ValueError as e:
        raise BackendError(str(e)) from None
    return OpenAIBackend(cfg, token_counter=counter)
