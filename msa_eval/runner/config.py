"""Typed run configuration. YAML suites (configs/helmet*.yaml) are validated by pydantic at
the edge (`load_suite`, unknown keys are errors) and turned into these dataclasses."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.attention.kinds import AttentionKind
from msa_eval.errors import MsaEvalError

Mode = Literal["chat", "completion"]


class ConfigError(MsaEvalError):
    """A bad suite file, flag value or run directory."""


# backend options that change how, not what, is computed: not part of the config hash (msa_telemetry measures
# the selection, not the answers)
_NOT_IDENTITY = ("api_key", "api_key_env", "timeout", "timeout_s", "timeout_per_1k_tokens_s", "max_retries",
                 "max_concurrency", "backoff_initial_s", "backoff_max_s", "cache_dir", "stream", "kv_cache_tokens",
                 "dequant_cache", "tensor_parallel_size", "msa_telemetry")


@dataclass(frozen=True)
class TaskEntry:
    name: str
    samples: int | None = None  # per length; None = the suite's default
    max_tokens: int | None = None  # generation budget override
    options: dict[str, Any] = field(default_factory=dict)  # constructor options (loaders)
    lengths: tuple[int, ...] = ()  # this task's lengths; empty = the suite's


@dataclass(frozen=True)
class SuiteConfig:
    name: str
    tasks: tuple[TaskEntry, ...]
    lengths: tuple[int, ...] = ()  # empty = chosen from the model's context
    samples: int = 5
    seed: int = 42
    mode: Mode = "chat"
    # MSA knobs for local msa/msa-ref backends (engine msa_overrides: topk, block_size, ...)
    msa_overrides: dict[str, Any] = field(default_factory=dict)
    # local backend: the arms run when --attention is not given (empty: msa,dense); in the backends, not hashed
    attention: tuple[str, ...] = ()


@dataclass(frozen=True)
class BackendSpec:
    kind: str  # "local" | "openai"
    model: str
    attention: AttentionKind | None = None  # local only
    base_url: str | None = None  # openai only
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Column name in reports: `local:msa`, `local:dense`, `openai:<model>`."""
        return f"{self.kind}:{self.attention}" if self.kind == "local" else f"{self.kind}:{self.model}"


@dataclass(frozen=True)
class RunConfig:
    suite: SuiteConfig
    backends: tuple[BackendSpec, ...]
    reference_model: str  # whose tokenizer fits the prompts (the local model by default)
    concurrency: int = 1

    def identity(self) -> dict[str, Any]:
        """What defines the results (not concurrency, not --limit): hashed for resume."""
        d = asdict(self)
        d.pop("concurrency")
        d["suite"].pop("attention")  # the arms are the backends
        for b in d["backends"]:
            b["options"] = {k: v for k, v in b["options"].items() if k not in _NOT_IDENTITY}
        return d

    def config_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --- YAML edge ------------------------------------------------------------------------------
class _TaskModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    samples: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    options: dict[str, Any] = {}
    lengths: list[int | str] = []


class _SuiteModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    tasks: list[_TaskModel | str]
    lengths: list[int | str] = []
    samples: int = Field(default=5, ge=1)
    seed: int = 42
    mode: Mode = "chat"
    msa_overrides: dict[str, Any] = {}
    attention: list[str] = []


def parse_length(text: str | int) -> int:
    """'2k' -> 2048, '7.5k' -> 7680, '4096' -> 4096, '1m' -> 1048576."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", str(text))
    if not m:
        raise ConfigError(f"bad length {text!r}: use tokens like 2048 or 2k,4k,7.5k,1m")
    v = float(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2).lower()]
    if v < 256 or v != int(v):
        raise ConfigError(f"bad length {text!r}: lengths are whole token counts >= 256")
    return int(v)


def parse_backend_opts(items: tuple[str, ...]) -> dict[str, Any]:
    """`key=value` pairs; values parsed as YAML scalars (ints, floats, bools, strings)."""
    out: dict[str, Any] = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"bad --backend-opt {it!r}: use key=value, e.g. max_retries=0")
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError:
            raise ConfigError(f"bad --backend-opt {it!r}: the value is not a YAML scalar; quote it, "
                              f"e.g. {k.strip()}='\"{v}\"'") from None
    return out


def parse_lengths(text: str) -> tuple[int, ...]:
    lengths = tuple(parse_length(x) for x in text.split(",") if x.strip())
    if not lengths:
        raise ConfigError(f"no length in {text!r}: give comma-separated target lengths, e.g. 2k,4k,8k")
    return lengths


def suite_from_dict(d: dict[str, Any], source: str) -> SuiteConfig:
    try:
        m = _SuiteModel.model_validate(d)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{source}: {loc}: {err['msg']} (fix the suite file)") from None
    tasks = tuple(
        TaskEntry(t) if isinstance(t, str) else TaskEntry(
            t.name, t.samples, t.max_tokens, t.options, tuple(parse_length(x) for x in t.lengths))
        for t in m.tasks)
    return SuiteConfig(m.name, tasks, tuple(parse_length(x) for x in m.lengths), m.samples,
                       m.seed, m.mode, dict(m.msa_overrides), tuple(m.attention))


def configs_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "configs"


def load_suite(name_or_path: str) -> SuiteConfig:
    """A suite by name (`configs/<name>.yaml`) or by path."""
    p = Path(name_or_path)
    if not p.suffix:
        p = configs_dir() / f"{name_or_path}.yaml"
    if not p.is_file():
        known = sorted(x.stem for x in configs_dir().glob("helmet*.yaml"))
        raise ConfigError(f"no suite {name_or_path!r}: use one of {known} or a path to a YAML suite")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file (not UTF-8): pass a YAML suite") from None
    if not isinstance(data, (dict, type(None))):
        raise ConfigError(f"{p}: a suite is a YAML mapping (name, tasks, lengths, ...), got {type(data).__name__}")
    return suite_from_dict(data or {}, str(p))
