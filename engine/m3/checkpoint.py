"""Read a MiniMax-M3 checkpoint directory: the hub layout of `MiniMaxM3SparseForConditionalGeneration`
(`language_model.`-prefixed text tensors beside the vision tower, projector and `mtp.*`, sharded through
`model.safetensors.index.json`), a text-only directory in the same names, or the internal layout that
transformers' text-only `MiniMaxM3VLForCausalLM.save_pretrained` writes (3-D `mlp.experts.gate_up_proj`,
`mlp.gate`, `self_attn.indexer.*`, fused `gate_up_proj`), all served under the hub names of
`names.checkpoint_tensors`.

`open_checkpoint` checks everything it can from the index and the safetensors headers before any tensor
data is read: every shard present and whole, every tensor of the config present with its shape, a
supported dtype and, for FP8, its block scales; anything else is one line naming the fix. Tensors come
out as float32 (block FP8 dequantised), one at a time.
"""
from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.errors import ModelIntegrityError, ModelNotFoundError, UnsupportedModelError
from engine.m3.fp8 import BLOCK, INDEX, TEXT_PREFIX, dequantize_fp8_blocks
from engine.m3.names import checkpoint_tensors

log = logging.getLogger(__name__)

FLOAT_DTYPES = ("F32", "BF16", "F16")
FP8 = "F8_E4M3"
FP8_FORMATS = ("e4m3", "float8_e4m3fn")
SUPPORTED_QUANT = ("bf16 / fp16 / fp32 weights, or block-scaled FP8 (quant_method fp8, fmt e4m3, "
                   "weight_block_size [128, 128], weight_scale_inv per block)")
LAYOUT_FIX = ("the checkpoint must hold every tensor its config.json implies, in the hub layout "
              "(language_model.model.layers.N.…) save_pretrained writes: download every shard again or re-save it")
_MAX_HEADER = 1 << 28


@dataclass(frozen=True)
class _Header:
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Source:
    """Where a hub-name tensor lives: `key` in `file`, optionally expert `expert` of a 3-D tensor and
    rows `rows` of the matrix; `scale` is the `weight_scale_inv` key of an FP8 weight."""

    file: str
    key: str
    expert: int | None = None
    rows: tuple[int, int] | None = None
    scale: str | None = None
    scale_file: str | None = None


def read_safetensors_header(path: Path) -> dict[str, _Header]:
    """The tensors a safetensors file declares (its JSON header: no tensor data read); a file
    shorter than its header says is refused."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        if not 0 < n <= min(_MAX_HEADER, size - 8):
            raise ModelIntegrityError(f"{path} is not a safetensors file (bad header): download it again")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise ModelIntegrityError(f"{path} has a damaged safetensors header: download it again") from None
    header.pop("__metadata__", None)
    end = max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    if size < 8 + n + end:
        raise ModelIntegrityError(f"{path} is truncated ({size} of {8 + n + end} bytes): download it again")
    return {k: _Header(v["dtype"], tuple(int(x) for x in v["shape"])) for k, v in header.items()}


def shard_files(path: Path) -> list[str]:
    """The shard files the index names (or the single `model.safetensors`), each checked present."""
    if (path / INDEX).is_file():
        try:
            weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        except (ValueError, KeyError, TypeError):
            raise ModelIntegrityError(f"{path / INDEX} is damaged (no weight_map): download it again") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise ModelIntegrityError(
                f"{path / missing[0]} is missing ({len(missing)} of the {len(files)} shards {INDEX} names are "
                "absent): download every shard of the checkpoint into that directory")
        return files
    if (path / "model.safetensors").is_file():
        return ["model.safetensors"]
    raise ModelNotFoundError(f"{path} has no {INDEX} or model.safetensors: save the model with safetensors")


def quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint's `quantization_config` (top level or under `text_config`) if supported, else
    UnsupportedModelError naming it and what is supported."""
    q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    bad = (f"quant_method '{method}'" if method != "fp8" else
           f"fp8 fmt '{q.get('fmt')}'" if q.get("fmt", "e4m3") not in FP8_FORMATS else
           f"fp8 weight_block_size {q.get('weight_block_size')}" if q.get("weight_block_size") != [BLOCK, BLOCK]
           else f"fp8 activation_scheme '{q.get('activation_scheme')}'"
           if q.get("activation_scheme", "dynamic") != "dynamic" else None)
    if bad:
        raise UnsupportedModelError(f"quantization_config {bad} is not supported: msa-eval reads {SUPPORTED_QUANT}")
    return dict(q)


def _internal(name: str, cfg: ModelConfig) -> tuple[str, int | None, tuple[int, int] | None] | None:
    """(key, expert, rows) of hub name `name` in transformers' internal text-only layout, or None."""
    assert cfg.m3 is not None
    m = re.fullmatch(r"(model\.layers\.\d+\.)(.*)", name)
    if not m:
        return None
    p, rest = m.groups()
    if e := re.fullmatch(r"block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight", rest):
        n = cfg.m3.moe_intermediate_size
        expert, w = int(e.group(1)), e.group(2)
        if w == "w2":
            return p + "mlp.experts.down_proj", expert, None
        return p + "mlp.experts.gate_up_proj", expert, (0, n) if w == "w1" else (n, 2 * n)
    if s := re.fullmatch(r"(mlp\.|block_sparse_moe\.shared_experts\.)(gate|up)_proj\.weight", rest):
        n = cfg.m3.dense_intermediate_size if s.group(1) == "mlp." else cfg.m3.shared_intermediate_size
        module = "mlp." if s.group(1) == "mlp." else "mlp.shared_experts."
        return p + module + "gate_up_proj.weight", None, (0, n) if s.group(2) == "gate" else (n, 2 * n)
    renames = {"block_sparse_moe.shared_experts.down_proj.weight": "mlp.shared_experts.down_proj.weight",
               "block_sparse_moe.gate.weight": "mlp.gate.weight",
               "block_sparse_moe.e_score_correction_bias": "mlp.gate.e_score_correction_bias"}
    if rest in renames:
        return p + renames[rest], None, None
    if i := re.fullmatch(r"self_attn\.index_(q|k)_(proj|norm)\.weight", rest):
        return p + f"self_attn.indexer.{i.group(1)}_{i.group(2)}.weight", None, None
    return None


def _skipped_kind(key: str) -> str:
    if key.startswith("vision_tower."):
        return "vision tower"
    if key.startswith("multi_modal_projector."):
        return "projector"
    if key.startswith("patch_merge_mlp."):
        return "patch_merge_mlp"
    return "mtp" if re.search(r"(^|\.)mtp[._]", key) else "other"


class M3Checkpoint:
    """A checked M3 checkpoint directory: hub-name tensors as float32, read one at a time."""

    def __init__(self, path: Path, cfg: ModelConfig, sources: dict[str, _Source], headers: dict[str, _Header],
                 quant: dict[str, Any] | None, files: list[str]):
        self.path = path
        self.cfg = cfg
        self.quantization_config = quant
        self._sources = sources
        self._headers = headers
        self._files = files
        self._shapes = checkpoint_tensors(cfg)
        self._handles: dict[str, Any] = {}

    def names(self) -> list[str]:
        return list(self._sources)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def stored_dtypes(self) -> dict[str, int]:
        """Text-model tensors per stored dtype (safetensors names: BF16, F8_E4M3, ...)."""
        return dict(Counter(self._headers[s.key].dtype for s in self._sources.values()))

    def parameter_count(self) -> int:
        """Text-model parameters (from the headers; FP8 scales not counted)."""
        return sum(math.prod(self._shapes[n]) for n in self._sources)

    def _read(self, f: Any, name: str, scale_handle: Any) -> torch.Tensor:
        s = self._sources[name]
        if s.expert is None and s.rows is None:
            t = f.get_tensor(s.key)
        else:
            sl = f.get_slice(s.key)
            r0, r1 = s.rows or (0, self._headers[s.key].shape[-2])
            t = sl[s.expert, r0:r1] if s.expert is not None else sl[r0:r1]
        if s.scale is not None:
            return dequantize_fp8_blocks(t, scale_handle.get_tensor(s.scale))
        return t.float()

    def _handle(self, file: str) -> Any:
        from safetensors import safe_open

        if file not in self._handles:
            self._handles[file] = safe_open(str(self.path / file), "pt")
        return self._handles[file]

    def tensor(self, name: str) -> torch.Tensor:
        """Hub-name tensor `name` as float32."""
        if name not in self._sources:
            raise KeyError(f"{name} is not a tensor of this M3 checkpoint")
        s = self._sources[name]
        return self._read(self._handle(s.file), name, self._handle(s.scale_file) if s.scale_file else None)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(hub name, float32 tensor) shard by shard: one shard mapped and one tensor built at a time."""
        from safetensors import safe_open

        for file in self._files:
            names = [n for n, s in self._sources.items() if s.file == file]
            if not names:
                continue
            with safe_open(str(self.path / file), "pt") as f:
                for n in names:
                    scale_file = self._sources[n].scale_file or file
                    yield n, self._read(f, n, f if scale_file == file else self._handle(scale_file))

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> M3Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_dtype(path: Path, key: str, h: _Header, headers: dict[str, _Header], quant: dict[str, Any] | None,
                 expected: tuple[int, ...]) -> str | None:
    """The scale key of an FP8 weight `key` (None for a float one), after checking dtype and scales."""
    if h.dtype in FLOAT_DTYPES:
        return None
    if h.dtype != FP8:
        raise UnsupportedModelError(f"{path}: tensor {key} is stored as {h.dtype}: msa-eval reads {SUPPORTED_QUANT}")
    if quant is None:
        raise UnsupportedModelError(f"{path}: tensor {key} is float8 but config.json has no quantization_config: "
                                    "add the block-FP8 quantization_config the checkpoint was written with")
    if len(expected) != 2:
        raise UnsupportedModelError(f"{path}: tensor {key} is a float8 {len(expected)}-D tensor: block FP8 is read "
                                    "for 2-D weights in the hub layout only")
    scale = key + "_scale_inv"
    grid = tuple(-(-d // BLOCK) for d in expected)
    sh = headers.get(scale)
    if sh is None:
        raise ModelIntegrityError(f"{path}: float8 tensor {key} has no {scale}: {LAYOUT_FIX}")
    if sh.dtype != "F32" or sh.shape != grid:
        raise ModelIntegrityError(f"{path}: {scale} is {sh.dtype} {list(sh.shape)}, block FP8 needs F32 "
                                  f"{list(grid)} (one scale per {BLOCK}x{BLOCK} block): re-save the checkpoint")
    return scale


def open_checkpoint(path: Path, cfg: ModelConfig) -> M3Checkpoint:
    """Check M3 checkpoint directory `path` against `cfg` (from its config.json) from the index and the
    headers alone, and return the reader. Tensors the text model does not use (vision tower, projector,
    patch merge, mtp) are skipped with one log line."""
    path = Path(path)
    if cfg.m3 is None:
        raise UnsupportedModelError(f"{path} is a '{cfg.arch}' checkpoint, not MiniMax-M3")
    config = json.loads((path / "config.json").read_text())
    quant = quantization(config)
    files = shard_files(path)
    headers: dict[str, _Header] = {}
    where: dict[str, str] = {}
    for f in files:
        for k, h in read_safetensors_header(path / f).items():
            headers[k], where[k] = h, f
    if (path / INDEX).is_file():
        for k, f in json.loads((path / INDEX).read_text())["weight_map"].items():
            if where.get(k) != f:
                raise ModelIntegrityError(f"{path / INDEX} puts {k} in {f} but that shard does not hold it: the "
                                          "index and the shards are from different downloads; download both again")
    prefix = TEXT_PREFIX if any(k.startswith(TEXT_PREFIX) for k in headers) else ""
    expected = checkpoint_tensors(cfg)
    sources: dict[str, _Source] = {}
    missing: list[str] = []
    for name, shape in expected.items():
        key, expert, rows = prefix + name, None, None
        if key not in headers and (alt := _internal(name, cfg)) is not None and prefix + alt[0] in headers:
            key, expert, rows = prefix + alt[0], alt[1], alt[2]
        if key not in headers:
            missing.append(prefix + name)
            continue
        h = headers[key]
        if expert is None and rows is None:
            want = shape
        elif expert is None:
            want = (2 * shape[0], *shape[1:])
        else:
            want = (cfg.m3.num_experts, 2 * shape[0] if rows else shape[0], *shape[1:])
        if h.shape != want:
            raise ModelIntegrityError(f"{path}: tensor {key} has shape {list(h.shape)} in the checkpoint but "
                                      f"config.json makes it {list(want)}: the config and the weights are from "
                                      "different models; use the config.json of the download")
        scale = _check_dtype(path, key, h, headers, quant, want) if expert is None and rows is None else None
        if scale is None and h.dtype == FP8:
            raise UnsupportedModelError(f"{path}: tensor {key} is float8 in transformers' internal layout: block FP8 "
                                        "is read in the hub layout only (re-save the model with its hub names)")
        if scale is None and h.dtype not in FLOAT_DTYPES:
            raise UnsupportedModelError(f"{path}: tensor {key} is stored as {h.dtype}: msa-eval reads "
                                        f"{SUPPORTED_QUANT}")
        sources[name] = _Source(where[key], key, expert, rows, scale, where[scale] if scale else None)
    if missing:
        raise ModelIntegrityError(f"{path}: tensor {missing[0]} is missing ({len(missing)} of the {len(expected)} "
                                  f"text-model tensors are absent): {LAYOUT_FIX}")
    used = {s.key for s in sources.values()} | {s.scale for s in sources.values() if s.scale}
    skipped = Counter(_skipped_kind(k) for k in headers if k not in used)
    if skipped:
        log.info("%s: skipped %d tensors the text model does not use (%s)", path, sum(skipped.values()),
                 ", ".join(f"{k} {n}" for k, n in sorted(skipped.items())))
    return M3Checkpoint(path, cfg, sources, headers, quant, files)
