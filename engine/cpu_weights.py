"""Weight modes of the CPU engine (`LLM(..., weights=...)`).

- "fp32": the float32 (dequantized) weights through `F.linear`: exact, the HF-parity path and the default.
- "bf16": every matmul (layers and lm_head) through a bfloat16 copy of its weight (`Bf16Linear`).
- "q4": matrices stored as Q4_0/Q4_1 in the GGUF run on those 4-bit codes (`Int4Linear`; fused Q/K/V
  and gate/up only when all their parts are 4-bit); a lm_head that is not 4-bit (e.g. the Q8_0
  embedding of the default model) runs through `engine.cpu_logits.Int8Head` (int8 ranking, exact
  float32 logits for each row's best 64; bf16 where torch's int8 GEMM is missing); every other
  matrix runs in bf16. Needs a GGUF with 4-bit tensors. The int4 kernel unpacks the
  codes for every row, so it wins at decode (a few rows) and loses to "bf16" at prefill (hundreds
  of rows: measured 1.3-2x slower at 16-128 rows); a row-count switch to a bf16 copy was tried
  and dropped: its prefill rounding flipped the near-tie first token of the "capital of France"
  chat (fp32 margin 0.08 logits), and one weight path per mode keeps batched == alone.

Threads: on a machine whose cores are busy with other work, run torch with fewer threads than
cores (`OMP_NUM_THREADS=1` on a shared 2-core VM): the int4 kernel opens a parallel region per
call and stalls whenever one of its threads is descheduled (measured 30x slower at 2 threads
under load). The residual stream, norms and softmax stay float32 in every mode; "bf16" and "q4"
keep dense K/V in bf16 (`engine.llm`); the float32 parameters stay on the model (sparsify and the
fp32 path use them), so the reduced-precision copies add memory rather than replace it. CPU only:
a GPU runs its `dtype`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.cpu_linear import Bf16Linear, Int4Linear
from engine.cpu_logits import Int8Head, int8_gemm_available
from engine.errors import EngineError
from engine.loader.gguf_q4 import Q4Blocks
from engine.model import CausalLM

WEIGHT_MODES = ("fp32", "bf16", "q4")

# fused model matrix -> the HF tensors it concatenates (rows), per layer
_FUSED = {
    "qkv": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "o_proj": ("self_attn.o_proj.weight",),
    "gate_up": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "down": ("mlp.down_proj.weight",),
}


def _int4_from_parts(parts: list[Q4Blocks], bias: torch.Tensor | None) -> Int4Linear:
    cat = lambda f: torch.cat([getattr(p, f) for p in parts])  # noqa: E731 - a one-line local helper
    return Int4Linear(cat("codes"), cat("scale"), cat("offset"), bias)


def attach_cpu_weights(model: CausalLM, mode: str, q4_blocks: dict[str, Q4Blocks] | None = None) -> dict[str, int]:
    """Give every layer's matmuls (and the lm_head) the `mode` implementation; returns how many
    matrices run each way, e.g. {"int4": 120, "int8": 1}. "fp32" removes any previous attachment."""
    if mode not in WEIGHT_MODES:
        raise EngineError(f"unknown weights mode {mode!r}: use one of {', '.join(WEIGHT_MODES)}")
    if next(model.parameters()).device.type != "cpu":
        raise EngineError(f"weights={mode!r} is a CPU serving mode: on a GPU leave weights at 'fp32' and pick dtype")
    counts = {"int4": 0, "int8": 0, "bf16": 0, "fp32": 0}
    q4_blocks = q4_blocks or {}
    if mode == "q4" and not q4_blocks:
        raise EngineError("weights='q4' runs a GGUF's Q4_0/Q4_1 tensors and this model has none: "
                          "use weights='bf16' (or a Q4_0/Q4_1 .gguf)")
    for i, layer in enumerate(model.layers):
        fast: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
        for attr, names in _FUSED.items():
            bias = layer.qkv_bias if attr == "qkv" else None
            parts = [q4_blocks.get(f"model.layers.{i}.{n}") for n in names]
            if mode == "fp32":
                counts["fp32"] += 1
                continue
            if mode == "q4" and all(p is not None for p in parts):
                fast[attr] = _int4_from_parts(parts, bias)
                counts["int4"] += 1
            else:
                fast[attr] = Bf16Linear(getattr(layer, attr), bias)
                counts["bf16"] += 1
        layer.fast_linears = fast or None
    head = model.embed if model.lm_head is None else model.lm_head
    head_q4 = q4_blocks.get("lm_head.weight" if model.lm_head is not None else "model.embed_tokens.weight")
    if mode == "fp32":
        model.fast_lm_head = None
        counts["fp32"] += 1
    elif mode == "q4" and head_q4 is not None:
        model.fast_lm_head = Int4Linear(head_q4.codes, head_q4.scale, head_q4.offset)
        counts["int4"] += 1
    elif mode == "q4" and int8_gemm_available():
        model.fast_lm_head = Int8Head(head)
        counts["int8"] += 1
    else:
        model.fast_lm_head = Bf16Linear(head)
        counts["bf16"] += 1
    return {k: v for k, v in counts.items() if v}
