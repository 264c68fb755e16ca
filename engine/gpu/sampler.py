"""Batched sampling: every row's argmax and finiteness in one pass on the logits' device and one host
copy; rows with temperature > 0 go through `engine.sampling.sample` (top-k / top-p on the device, the
draw on the CPU with the request's seeded generator, so seeds reproduce on every device).

Rows are independent: a row whose sampling fails comes back as its exception, never raised, so one
request's fault costs no other request its token (the engine finishes that request with the error).
With `allowed` (constrained requests, `engine.constrained.allowed_tokens`) a constrained row draws among its
allowed tokens; a row without a constraint is sampled from its logits untouched."""
from __future__ import annotations

import torch

from engine.sampling import SamplingError, SamplingParams, sample
from engine.sequence import Sequence


def sample_batch(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
                 allowed: torch.Tensor | None = None) -> list[int | Exception]:
    """logits `[n, vocab]` fp32 (and `allowed` `[n, vocab]` bool, or None) -> per row a token id, or the
    exception its sampling raised."""
    if logits.shape[0] != len(params):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(params)} requests")
    finite_rows = torch.isfinite(logits).all(dim=-1).long()
    if allowed is None:
        best, finite = torch.stack([logits.argmax(dim=-1), finite_rows]).tolist()
        possible = [1] * len(params)
    else:  # the argmax among the allowed tokens; a row with none allowed fails
        masked = logits.masked_fill(~allowed, float("-inf"))
        best, finite, possible = torch.stack([masked.argmax(dim=-1), finite_rows, allowed.any(dim=-1).long()]).tolist()
    out: list[int | Exception] = []
    for i, p in enumerate(params):
        if not finite[i]:
            out.append(SamplingError("the model's logits for this request hold NaN or inf: no token can be drawn"))
        elif not possible[i]:
            out.append(SamplingError("the request's grammar allows no next token"))
        elif p.temperature == 0.0:
            out.append(best[i])
        else:
            try:
                row_allowed = allowed[i] if allowed is not None and p.constraint is not None else None
                out.append(sample(logits[i], p, generators[i], row_allowed))
            except Exception as e:  # noqa: BLE001 - this row's fault only
                out.append(e)
    return out


def sample_requests(seqs: list[Sequence], logits: torch.Tensor, allowed: torch.Tensor | None = None
                    ) -> tuple[list[tuple[Sequence, int, torch.Tensor]], dict[str, Exception]]:
    """Draw each request's token from its row of `logits` `[len(seqs), vocab]` (within `allowed`, when given):
    (request, token, its logits row, unmasked) for every row that could be sampled, and {request id: fault}
    for those that could not."""
    toks = sample_batch(logits, [q.params for q in seqs], [q.generator for q in seqs], allowed)
    drawn = [(q, t, logits[i]) for i, (q, t) in enumerate(zip(seqs, toks, strict=True)) if not isinstance(t, Exception)]
    return drawn, {q.request_id: t for q, t in zip(seqs, toks, strict=True) if isinstance(t, Exception)}
