"""Endpoint presets (`configs/endpoints/<name>.yaml`): a base URL and a model id, nothing else.

The API key never lives in a preset: the backend reads it from the environment variable
named by its `api_key_env` option at call time.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from msa_eval.errors import MsaEvalError

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "endpoints"


class EndpointPreset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str
    model: str


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name_or_path: str) -> EndpointPreset:
    """A preset by name (`minimax`, `local-vllm`, ...) or by path to a YAML file."""
    p = Path(name_or_path)
    if not p.suffix:
        p = PRESET_DIR / f"{name_or_path}.yaml"
    if not p.exists():
        raise MsaEvalError(f"unknown endpoint preset {name_or_path!r}; choose one of {preset_names()} "
                           "or give a YAML path")
    try:
        return EndpointPreset.model_validate(yaml.safe_load(p.read_text()) or {})
    except (ValidationError, yaml.YAMLError) as e:
        raise MsaEvalError(f"bad endpoint preset {p}: expected exactly the keys base_url and model "
                           f"({e.__class__.__name__})") from e
