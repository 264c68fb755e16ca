"""The KL alignment objective of MSA (msa-spec section 3) on contiguous sequences, plus the
block selection and the attention-mass recall used to judge an indexer.

Shapes: a sequence of S tokens; Q sampled query positions `pos [Q]`; main attention q `[Q, Hq, d]`
(post-RoPE), k `[S, Hkv, d]`; index q_idx `[Q, Hkv, d_idx]`, k_idx `[S, d_idx]`.

* teacher: per query head the main softmax (scale 1/sqrt(d)) over the support, averaged over the
  heads of the KV group -> `[Q, Hkv, S]`, no gradient (option "max": the per-key max over the
  group's heads, renormalised on the support; `teacher_probs`);
* student: softmax of q_idx . k_idx / sqrt(d_idx) over the same support;
* dense warm-up: support = the whole causal history `j <= pos`;
* sparse: support = the tokens `j <= pos` of the blocks the student itself selects (top k-1 history
  blocks by block-max score, ties to the smaller id, plus the own block); each head's teacher is
  renormalised over that support (the main branch's LSE is the sparse one) before averaging.
Loss = mean over (query, group) of KL(teacher || student).
"""
from __future__ import annotations

import math

import torch


def causal_mask(pos: torch.Tensor, seq_len: int) -> torch.Tensor:
    """bool `[Q, S]`: key j visible to the query at position pos."""
    return torch.arange(seq_len, device=pos.device)[None, :] <= pos[:, None]


def head_logits(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Main logits fp32 `[Q, Hkv, G, S]` (-inf where invisible)."""
    qn, hq, d = q.shape
    hkv = k.shape[1]
    s = torch.einsum("qgkd,sgd->qgks", q.float().view(qn, hkv, hq // hkv, d), k.float()) / math.sqrt(d)
    return s.masked_fill(~causal_mask(pos, k.shape[0])[:, None, None, :], float("-inf"))


def index_logits(q_idx: torch.Tensor, k_idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Student logits fp32 `[Q, Hkv, S]` (-inf where invisible)."""
    s = torch.einsum("qhd,sd->qhs", q_idx.float(), k_idx.float()) / math.sqrt(q_idx.shape[-1])
    return s.masked_fill(~causal_mask(pos, k_idx.shape[0])[:, None, :], float("-inf"))


def select_blocks(scores: torch.Tensor, pos: torch.Tensor, block: int, topk: int) -> torch.Tensor:
    """Selection rule of the MSA indexer on token scores `[Q, H, S]` -> bool block mask `[Q, H, nb]`.

    History candidates are the blocks before the own block `pos // B`; the best `k - 1` by block max
    (ties to the smaller id: stable sort) are kept, plus the own block."""
    qn, h, s = scores.shape
    nb = -(-s // block)
    pad = nb * block - s
    sc = torch.nn.functional.pad(scores, (0, pad), value=float("-inf")) if pad else scores
    return select_top_blocks(sc.view(qn, h, nb, block).amax(-1), pos, block, topk)


def select_top_blocks(bscores: torch.Tensor, pos: torch.Tensor, block: int, topk: int) -> torch.Tensor:
    """Block scores `[Q, H, nb]` -> bool block mask `[Q, H, nb]`: the best `k - 1` history blocks
    (ties to the smaller id) plus the own block `pos // B`."""
    bmax = bscores
    nb = bmax.shape[-1]
    own = (pos // block)[:, None, None]
    ids = torch.arange(nb, device=bscores.device)[None, None, :]
    bmax = bmax.masked_fill(ids >= own, float("-inf"))
    order = torch.sort(bmax, dim=-1, descending=True, stable=True).indices
    n_hist = torch.clamp(pos // block, max=topk - 1)  # [Q]
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(nb, device=bscores.device).expand_as(order))
    keep = (rank < n_hist[:, None, None]) & (ids < own)
    return keep | (ids == own)


def expand_blocks(sel: torch.Tensor, block: int, seq_len: int) -> torch.Tensor:
    """bool `[Q, H, nb]` -> `[Q, H, S]`."""
    return sel.repeat_interleave(block, dim=-1)[..., :seq_len]


TEACHERS = ("mean", "max")


def teacher_probs(t_logits: torch.Tensor, support: torch.Tensor, teacher: str = "mean") -> torch.Tensor:
    """Group teacher `[Q, Hkv, S]` from main logits `[Q, Hkv, G, S]` on `support` (bool `[Q, Hkv, S]`).

    Each head is renormalised over the support first. "mean" (msa-spec section 3): the average of
    the group's heads. "max": per key the largest of the group's head probabilities, renormalised
    over the support, so a key that one head alone reads (a retrieval head) keeps its weight
    instead of being divided by the group size."""
    if teacher not in TEACHERS:
        raise ValueError(f"teacher {teacher!r} is not one of {TEACHERS}")
    p = torch.softmax(t_logits.masked_fill(~support[:, :, None, :], float("-inf")), dim=-1)
    if teacher == "mean":
        return p.mean(2)
    m = p.amax(2)
    return m / m.sum(-1, keepdim=True).clamp_min(1e-30)


def kl_loss(t_logits: torch.Tensor, s_logits: torch.Tensor, support: torch.Tensor,
            teacher: str = "mean") -> torch.Tensor:
    """Mean KL(teacher || student) over (query, group) on `support` (bool `[Q, Hkv, S]`).

    t_logits `[Q, Hkv, G, S]` main logits (the group teacher of `teacher_probs`), s_logits
    `[Q, Hkv, S]` student logits."""
    neg = float("-inf")
    t = teacher_probs(t_logits, support, teacher)
    log_s = torch.log_softmax(s_logits.masked_fill(~support, neg), dim=-1)
    log_t = torch.log(t.clamp_min(1e-30))
    kl = torch.where(t > 0, t * (log_t - log_s.clamp_min(-1e30)), torch.zeros_like(t)).sum(-1)
    return kl.mean()


def sparse_support(s_logits: torch.Tensor, pos: torch.Tensor, block: int, topk: int) -> torch.Tensor:
    with torch.no_grad():
        sel = select_blocks(s_logits.detach(), pos, block, topk)
        return expand_blocks(sel, block, s_logits.shape[-1]) & causal_mask(pos, s_logits.shape[-1])[:, None, :]


def mass_recall(t_logits: torch.Tensor, s_logits: torch.Tensor, pos: torch.Tensor, block: int,
                topk: int) -> torch.Tensor:
    """Per query head, the dense softmax mass inside the student's selected blocks: `[Q, Hkv, G]`."""
    p = torch.softmax(t_logits, dim=-1)
    sup = sparse_support(s_logits, pos, block, topk)
    return (p * sup[:, :, None, :]).sum(-1)


def far_mass(t_logits: torch.Tensor, pos: torch.Tensor, block: int) -> torch.Tensor:
    """`[Q]`: per query the largest (over heads) dense mass outside the own block, i.e. on keys
    before `(pos // B) * B` -- how much a query reads from far away."""
    p = torch.softmax(t_logits, dim=-1)  # [Q, Hkv, G, S]
    far = torch.arange(t_logits.shape[-1], device=pos.device)[None, :] < ((pos // block) * block)[:, None]
    return (p * far[:, None, None, :]).sum(-1).flatten(1).amax(1)
