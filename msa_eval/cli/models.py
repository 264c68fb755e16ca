"""`msa-eval models list | pull NAME | info NAME`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from msa_eval import display


@click.group()
def models() -> None:
    """The model store: built-in models and local checkpoints."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_models(as_json: bool) -> None:
    """Built-in models and whether they are in the cache."""
    from engine import store

    rows: list[dict[str, Any]] = [{"name": m.name, "cached": store.is_cached(m.name), "size_bytes": m.size,
             "path": str(store.cached_path(m.name)), "description": m.description}
            for m in store.BUILTIN_MODELS.values()]
    if as_json:
        display.print_json(rows)
    else:
        display.table("models", ["name", "cached", "size", "description"],
                      [(r["name"], "yes" if r["cached"] else "no", f"{r['size_bytes'] / 1e6:.1f} MB", r["description"])
                       for r in rows])


@models.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="Download again even if cached.")
def pull(name: str, force: bool) -> None:
    """Fetch a built-in model into the cache (verified, atomic)."""
    from engine import store

    path = store.pull(name, force=force)
    display.info(f"ok {name} -> {path}")


@models.command("info")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def info(name: str, as_json: bool) -> None:
    """Architecture and tokenizer of a model (built-in name, HF directory or .gguf). A MiniMax-M3 directory
    is described from its config.json and safetensors headers, its weights never read."""
    import dataclasses

    from engine.loader import load, resolve_model_path

    _, path = resolve_model_path(name)
    if path.is_dir() and _m3_info(name, path, as_json):
        return
    m = load(name)
    d: dict[str, Any] = {"model_id": m.model_id, "path": str(m.path), "sha256": m.sha256,
         "config": dataclasses.asdict(m.config), "chat_template": m.tokenizer.chat_template is not None,
         "tokenizer_sha256": m.tokenizer.fingerprint(),
         "parameters": sum(t.numel() for t in m.weights.values())}
    if as_json:
        display.print_json(d)
    else:
        c = m.config
        display.table(f"model {m.model_id}", ["field", "value"], [
            ("path", d["path"]), ("arch", c.arch), ("layers", c.num_layers), ("hidden", c.hidden_size),
            ("heads q/kv", f"{c.num_heads}/{c.num_kv_heads} (group {c.group_size})"),
            ("head dim", c.head_dim), ("context", c.max_position), ("rope theta", c.rope_theta),
            ("rope scaling", c.rope_scaling.kind), ("vocab", c.vocab_size),
            ("parameters", f"{d['parameters'] / 1e6:.1f} M"),
            ("chat template", "yes" if d["chat_template"] else "no"), ("sha256", d["sha256"] or "-")])


def _m3_info(name: str, path: Path, as_json: bool) -> bool:
    """Print `models info` for an M3 directory (True), or leave other families to the loader (False)."""
    from engine.config import from_hf_config
    from engine.errors import ModelIntegrityError
    from engine.loader.hf_loader import load_hf_tokenizer
    from engine.m3.info import describe, rows

    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError:
        raise ModelIntegrityError(f"{path / 'config.json'} is not valid JSON: download or re-save it") from None
    cfg = from_hf_config(config)
    if cfg.family != "minimax_m3":
        return False
    tok = load_hf_tokenizer(path, cfg)
    d = {"model_id": path.name, "path": str(path), **describe(path, cfg),
         "chat_template": tok.chat_template is not None, "tokenizer_sha256": tok.fingerprint()}
    if as_json:
        display.print_json(d)
    else:
        display.table(f"model {d['model_id']}", ["field", "value"],
                      [("path", d["path"]), *rows(d), ("chat template", "yes" if d["chat_template"] else "no")])
    return True
