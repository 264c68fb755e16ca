"""CPU lm_head of the "q4" weight mode: an int8 GEMM ranks the vocabulary, then the best candidates of
every row get exact float32 logits.

The default model's lm_head (its Q8_0 token embedding, `[49152, 576]`) is the largest single read of
a decode step: 57 MB in bf16, 4.2 ms of a 25 ms batch-8 step. `Int8Head` instead:

1. approximates every logit with fbgemm's int8 GEMM (`quantized::linear_dynamic`: weights int8 with
   one scale per vocabulary row, requantized from the float32 weight; the input quantized to uint8
   per call). fbgemm gives the whole input one scale, so each row of h is first divided by its
   max |h| (one scale per row, in effect), and the `OUTLIER_COLS` channels with the largest |h| in
   the batch (hidden states carry a few channels 10-20x larger than the rest) are zeroed there and
   multiplied in bf16 against a transposed bf16 copy of the weight instead;
2. recomputes the `EXACT_TOP` best candidates of each row against the float32 weight and writes them
   over the approximation.

Greedy picks and the head of the distribution are the float32 lm_head's (as long as the true top
token is among the approximation's best 64; measured: always); the tail keeps the int8 error
(relative ~7e-3 of the logits). On 512 positions of real text, lm_head alone vs float32: top-1 100%
(bf16 lm_head: 97.5%), mean KL 1.9e-4 (bf16: 5.2e-4); at 8 rows ~2.0 ms against 3.7 ms in bf16
(AMD EPYC, one thread). Needs torch's fbgemm quantized ops (x86); `int8_gemm_available()` says
whether they run here. Rows are independent except through the batch's outlier channels, which only
move the approximated tail.
"""
from __future__ import annotations

import functools
import warnings

import torch

OUTLIER_COLS = 8  # hidden channels multiplied in bf16 instead of int8, per call
EXACT_TOP = 64  # candidates per row whose logits are recomputed in float32


@functools.lru_cache(maxsize=1)
def _has_vnni() -> bool:
    """fbgemm's int8 kernels without VNNI sum u8*s8 pairs in int16 (saturates): reduce the input to 7 bits there."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = fh.read()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


@functools.lru_cache(maxsize=1)
def int8_gemm_available() -> bool:
    """Whether torch's fbgemm dynamic int8 linear runs on this machine."""
    try:
        _pack(torch.ones(4, 8))
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _pack(weight: torch.Tensor):
    """float32 `[N, K]` -> fbgemm's packed int8 weight (one scale per row)."""
    scale = (weight.abs().amax(1) / 127).clamp_min(1e-12).double()
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch >= 2.12 marks quantized tensors deprecated; the pinned torch has them
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(weight, scale, zeros, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None)


class Int8Head:
    """h `[T, K]` (any float dtype) -> float32 logits `[T, V]` for the float32 lm_head `weight` `[V, K]`."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight.detach().float()  # shares the model's float32 parameter
        self.vocab, self.hidden = self.weight.shape
        self.packed = _pack(self.weight)
        self.weight_t = self.weight.t().contiguous().to(torch.bfloat16)  # [K, V]: rows = hidden channels
        self.reduce_range = not _has_vnni()

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        x = h.float()
        t = x.shape[0]
        if t == 0:
            return x.new_empty(0, self.vocab)
        cols = x.abs().amax(0).topk(min(OUTLIER_COLS, self.hidden)).indices
        rest = x.index_fill(1, cols, 0.0)
        r = rest.abs().amax(1, keepdim=True).clamp_min(1e-30)
        logits = torch.ops.quantized.linear_dynamic(rest / r, self.packed, self.reduce_range).mul_(r)
        logits.add_(torch.mm(x.index_select(1, cols).to(torch.bfloat16), self.weight_t.index_select(0, cols)))
        top = logits.topk(min(EXACT_TOP, self.vocab), dim=-1).indices  # [T, top]
        rows = self.weight.index_select(0, top.reshape(-1)).view(t, top.shape[1], self.hidden)
        return logits.scatter_(1, top, torch.bmm(rows, x[:, :, None]).squeeze(-1))

    def nbytes(self) -> int:
        """Bytes this head adds to the model (the packed int8 weight and the bf16 transpose)."""
        return self.vocab * self.hidden * 3
