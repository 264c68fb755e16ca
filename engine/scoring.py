"""Log-probabilities of given tokens under the model: prompt scoring and generated-token log-probs.

A request asks with `SamplingParams.prompt_logprobs` / `logprobs` (the top-n alternatives to keep).
Prompt rows are computed during the request's own prefill chunks (the scheduler caps how many
scored rows one step holds: each needs a full-vocabulary row of logits), generated rows from the
sampling logits of the step that drew the token; both are the model's full distribution, before
temperature / top-k / top-p. One vectorised pass per step: log-softmax over the vocabulary,
the targets' entries and `torch.topk` over every row together, then one host copy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine.sequence import LogprobRow

if TYPE_CHECKING:
    from engine.scheduler import ScheduledChunk
    from engine.sequence import Sequence


def logprob_rows(logits: torch.Tensor, targets: list[int], top_ns: list[int]) -> list[LogprobRow]:
    """logits `[n, vocab]` fp32, the n target ids and each row's number of alternatives -> n rows."""
    if logits.shape[0] != len(targets) or len(targets) != len(top_ns):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(targets)} targets and {len(top_ns)} top-n")
    if not targets:
        return []
    lp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(targets, dtype=torch.long, device=lp.device)
    cols = [lp.gather(1, idx[:, None]).double()]
    top = min(max(top_ns), lp.shape[1])
    if top:
        v, i = torch.topk(lp, top, dim=-1)
        cols += [v.double(), i.double()]  # ids are exact in float64: one tensor, one host copy
    host = torch.cat(cols, dim=1).cpu().tolist()
    rows: list[LogprobRow] = []
    for r, n in zip(host, top_ns, strict=True):
        n = min(n, top)
        rows.append((r[0], {int(k): v for k, v in zip(r[1 + top:1 + top + n], r[1:1 + n], strict=True)}))
    return rows


def add_prompt_rows(chunks: list[ScheduledChunk], logits: torch.Tensor | None) -> dict[str, Exception]:
    """Append each prefill chunk's scored rows (`logits` `[sum of scored_rows, vocab]`, chunk order) to its
    request's prompt log-probs (row j scores prompt token start + j + 1). The pass is shared by the
    step's scoring requests, so a fault in it is theirs: returns {request id: fault}."""
    if not chunks:
        return {}
    try:
        targets = [t for c in chunks for t in c.seq.prompt_ids[c.start + 1:c.start + 1 + c.scored_rows]]
        tops = [c.seq.params.prompt_logprobs for c in chunks for _ in range(c.scored_rows)]
        rows, k = logprob_rows(logits, targets, tops), 0
    except Exception as e:  # noqa: BLE001 - a scoring fault ends these requests, not the engine
        return {c.seq.request_id: e for c in chunks}
    for c in chunks:
        c.seq.prompt_logprobs += rows[k:k + c.scored_rows]
        k += c.scored_rows
    return {}


def add_token_rows(drawn: list[tuple[Sequence, int, torch.Tensor]]) -> dict[str, Exception]:
    """Append each drawn token's row, from the logits it was sampled from ((request, token, logits `[vocab]`),
    requests without `logprobs` skipped); {request id: fault} like `add_prompt_rows`."""
    drawn = [d for d in drawn if d[0].params.logprobs is not None]
    if not drawn:
        return {}
    try:
        rows = logprob_rows(torch.stack([r for _, _, r in drawn]), [t for _, t, _ in drawn],
                            [seq.params.logprobs for seq, _, _ in drawn])
    except Exception as e:  # noqa: BLE001 - a scoring fault ends these requests, not the engine
        return {seq.request_id: e for seq, _, _ in drawn}
    for (seq, _, _), row in zip(drawn, rows, strict=True):
        seq.output_logprobs.append(row)
    return {}
