"""Block-scaled FP8 weights as DeepSeek-V3 and MiniMax-M3 store them: a matrix `X.weight` in float8
e4m3 and `X.weight_scale_inv` in fp32, one scale per 128 x 128 block (`[ceil(out/128), ceil(in/128)]`),
with `w ~= q * scale_inv` inside each block and `scale_inv = amax(|w| in the block) / 448` (448: the
largest e4m3 value). `write_fp8_checkpoint` re-saves a bf16 / fp32 checkpoint directory that way
(tests and benchmarks: the real FP8 checkpoint's format from any small one)."""
from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import torch

from engine.errors import ModelNotFoundError, UnsupportedModelError
from engine.m3.names import is_projection

BLOCK = 128
E4M3_MAX = 448.0
QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                       "weight_block_size": [BLOCK, BLOCK]}
TEXT_PREFIX = "language_model."
INDEX = "model.safetensors.index.json"


def _grid(n: int, block: int) -> int:
    return -(-n // block)


def quantize_fp8_blocks(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(q float8_e4m3fn of `w`'s shape, scale_inv fp32 `[ceil(out/block), ceil(in/block)]`) of a 2-D `w`;
    an all-zero block gets scale 1 (its q is zero)."""
    if w.dim() != 2:
        raise ValueError(f"block FP8 quantizes 2-D matrices, got shape {tuple(w.shape)}")
    out, inn = w.shape
    ro, ri = _grid(out, block), _grid(inn, block)
    padded = torch.nn.functional.pad(w.float(), (0, ri * block - inn, 0, ro * block - out))
    blocks = padded.view(ro, block, ri, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, E4M3_MAX / amax, torch.ones_like(amax))  # as transformers' Fp8Quantize does
    q = (blocks * scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(ro * block, ri * block)[:out, :inn].contiguous(), 1.0 / scale


def dequantize_fp8_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """fp32 `q * scale_inv` with each scale spread over its block."""
    out, inn = q.shape
    if tuple(scale_inv.shape) != (_grid(out, block), _grid(inn, block)):
        raise ValueError(f"scale_inv {tuple(scale_inv.shape)} does not tile {tuple(q.shape)} in {block}-blocks")
    s = scale_inv.float().repeat_interleave(block, 0)[:out].repeat_interleave(block, 1)[:, :inn]
    return q.float() * s


def _shards(src: Path) -> tuple[list[str], dict | None]:
    """The shard file names of `src` and its index (None for a single `model.safetensors`)."""
    if (src / INDEX).is_file():
        index = json.loads((src / INDEX).read_text())
        return sorted(set(index["weight_map"].values())), index
    if (src / "model.safetensors").is_file():
        return ["model.safetensors"], None
    raise ModelNotFoundError(f"{src} has no {INDEX} or model.safetensors: pass a safetensors checkpoint directory")


def _text_name(key: str) -> str:
    return key[len(TEXT_PREFIX):] if key.startswith(TEXT_PREFIX) else key


def write_fp8_checkpoint(src: Path, dst: Path) -> Path:
    """Copy checkpoint directory `src` to `dst` with every 2-D projection weight of the text model
    (`names.is_projection`) in block FP8 plus its `weight_scale_inv`; embeddings, lm_head, norms, the
    router and everything outside the text model keep their dtype; `quantization_config` goes into
    config.json; the other files (tokenizer, generation config) are copied. Built in a temporary
    directory beside `dst` and renamed into place, so `dst` is either absent or complete."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if dst.exists():
        raise FileExistsError(f"{dst} exists: write the FP8 checkpoint to a new directory")
    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config"):
        raise UnsupportedModelError(f"{src} is already quantized: write_fp8_checkpoint takes bf16 / fp32 weights")
    files, index = _shards(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.tmp")
    tmp.mkdir()
    try:
        weight_map: dict[str, str] = {}
        total = 0
        for fname in files:
            out: dict[str, torch.Tensor] = {}
            with safe_open(str(src / fname), "pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    if is_projection(_text_name(key)) and t.dim() == 2:
                        out[key], out[key + "_scale_inv"] = quantize_fp8_blocks(t)
                    else:
                        out[key] = t
            save_file(out, str(tmp / fname), metadata={"format": "pt"})
            for key, t in out.items():
                weight_map[key] = fname
                total += t.numel() * t.element_size()
            del out
        if index is not None:
            meta = {k: v for k, v in (index.get("metadata") or {}).items() if k != "total_size"}
            (tmp / INDEX).write_text(json.dumps({"metadata": {**meta, "total_size": total},
                                                 "weight_map": dict(sorted(weight_map.items()))}, indent=2))
        config["quantization_config"] = dict(QUANTIZATION_CONFIG)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for p in src.iterdir():
            if p.is_file() and p.name not in {"config.json", INDEX, *files}:
                shutil.copy2(p, tmp / p.name)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst
