"""Endpoint presets (`configs/endpoints/<name>.yaml`): a base URL and a model id, and optionally the
endpoint's timeouts (`timeout_s`, `timeout_per_1k_tokens_s`: the openai backend's options of the same
names, e.g. for a slow long-context endpoint); nothing else.

The API key never lives in a preset: the backend reads it from the environment variable
named by its `api_key_env` option at call time.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from msa_eval.errors import MsaEvalError

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "endpoints"


class EndpointPreset(BaseModel):
    model_config = ConfigDict(extra="forbid")
    base_url: str
    model: str
    timeout_s: float | None = Field(default=None, gt=0)
    timeout_per_1k_tokens_s: float | None = Field(default=None, gt=0)

    def backend_options(self) -> dict[str, float]:
        """The openai backend options this preset sets (its timeouts), to merge under the command line's."""
        return {k: v for k in ("timeout_s", "timeout_per_1k_tokens_s") if (v := getattr(self, k)) is not None}


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
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "body"
        raise MsaEvalError(f"bad endpoint preset {p}: {where}: {err['msg']} (keys: base_url and model, optional "
                           "timeout_s and timeout_per_1k_tokens_s > 0)") from None
    except yaml.YAMLError as e:
        raise MsaEvalError(f"bad endpoint preset {p}: not valid YAML ({str(e).splitlines()[0]})") from None
