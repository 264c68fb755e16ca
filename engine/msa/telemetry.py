"""Selection telemetry: what MSA's indexer chose, measured per request against the oracle and dense attention.

Opt-in (`LLM(..., msa_telemetry=True)` or a `TelemetryConfig`; `msa-eval run` turns it on for local MSA
arms). Measured over *probe queries* only: the last `probe_queries` prompt positions (P = 64 by default:
the question tokens that must find the needle) and every decode token. Per MSA layer, per KV group, each
probe row contributes (one row = one query position; every value lies in [0, 1]):

- `recall`: |indexer's blocks ∩ oracle's blocks| / |oracle's blocks|. The oracle is
  `engine.attention.oracle`'s rule (`kernels.indexer.naive.select_blocks` on the dense attention mass of
  the group's query heads: the top k - 1 earlier blocks, the own block forced). A block of the indexer
  whose mass is within 1e-6 of the oracle's smallest history block counts as the oracle's (equal masses
  are equally good choices; float rounding must not flip them).
- `far_recall`: `recall` over the oracle's *far* blocks only: its history blocks other than the context's
  first block (the attention sink) and the block just before the query's own (ids 1 .. pos // B - 2). A needle
  the question must find is one of these; sink and neighbour blocks are easy and make up most of `recall`.
  Rows whose oracle keeps no far block add nothing (per KV group).
- `mass`: the dense attention mass inside the indexer's blocks (group mean over its query heads);
  `mass_recall`: that mass / the mass inside the oracle's blocks (1 = as good as the best choice).
- `keys_read`: keys the attention reads for the row / keys dense attention reads: the selected blocks'
  keys at or before the query position, over pos + 1.
- `local_share`: the share of the group's dense attention mass on the keys of the query's own block
  (the block MSA always keeps: positions B * (pos // B) .. pos), group mean over its query heads.
- `layer_overlap` (per layer l): |blocks of layer l ∩ blocks of the next MSA layer| / |blocks of layer l|
  for the same query (what sharing layer l's index with the next layer would lose); the count is k once
  the context holds k blocks. The last MSA layer has none (None).
- `decode_overlap`: for each decode token, |its blocks ∩ the previous query token's blocks| / |its
  blocks| (the previous token: the last prompt token for the first decode step); None without decode.

The dense masses are computed exactly in fp32 over the probe rows only (O(P x context) per layer, in
row chunks of `engine.msa.recall.chunk_elements`: 2^24 fp32 elements on a CPU, 2^28 on a GPU), never
O(context^2).

Stored per request as `RequestOutput.metrics["msa_telemetry"]` (`summary()`), rounded to 4 digits:
`{"version", "probe_queries", "prefill_probes", "decode_tokens", "decode", "layers": [MSA layer ids],
"<metric>": [[per KV group] per layer] for each metric above, "mean": {"<metric>": mean over layers
and groups}}`.

On a GPU, decode steps normally replay CUDA graphs; with telemetry on the engine runs every step eagerly
(`"decode": "eager"`): the selections of prefill probes and of every decode token are measured. A
telemetry run is a quality run, not a speed run (single process: not under tensor parallelism).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.dense import gather_kv
from engine.attention.meta import AttentionMeta
from engine.msa.recall import chunk_elements, decode_step_probs, dense_probs, single_query_rows

METRICS = ("recall", "mass_recall", "mass", "keys_read", "local_share", "far_recall", "layer_overlap",
           "decode_overlap")
_LAYER_OVERLAP, _DECODE_OVERLAP = METRICS.index("layer_overlap"), METRICS.index("decode_overlap")
_TIE = 1e-6  # block masses this close to the oracle's smallest kept mass count as the oracle's
VERSION = 2  # 2: far_recall, counts per KV group


@dataclass(frozen=True)
class TelemetryConfig:
    """probe_queries: the last P prompt positions measured (every decode token is measured too)."""

    probe_queries: int = 64

    def __post_init__(self) -> None:
        if self.probe_queries < 1:
            raise ValueError(f"probe_queries must be >= 1, got {self.probe_queries}")


def overlap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Block ids `[n, H, k]` (-1 padding) -> `[n, H]`: |a ∩ b| / |a|."""
    hit = ((a[..., :, None] == b[..., None, :]) & (b[..., None, :] >= 0)).any(-1) & (a >= 0)
    return hit.sum(-1) / (a >= 0).sum(-1).clamp(min=1)


def block_mass(p: torch.Tensor, hkv: int, block: int) -> torch.Tensor:
    """Dense probabilities fp32 `[n, Hq, S]` (`dense_probs`) -> each KV group's mean mass per block `[n, Hkv, nb]`."""
    n, hq, s = p.shape
    nb = -(-s // block)
    mass = p.view(n, hkv, hq // hkv, s).sum(2) / (hq // hkv)
    return torch.nn.functional.pad(mass, (0, nb * block - s)).view(n, hkv, nb, block).sum(-1)


def row_metrics(mass: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor, block: int, topk: int) -> torch.Tensor:
    """Probe rows: their block masses fp32 `[n, Hkv, nb]` (`block_mass`; blocks past a row's position have 0),
    positions `[n]`, the indexer's ids `[n, Hkv, topk]` -> fp32 `[6, n, Hkv]`: recall, mass_recall, mass,
    keys_read, local_share, far_recall (NaN where the oracle keeps no far block; module docstring)."""
    from kernels.indexer.naive import select_blocks

    n, hkv, nb = mass.shape
    dev = mass.device
    bid = torch.arange(nb, device=dev)  # block ids
    own = pos // block
    oracle = select_blocks(mass, own, topk)

    def chosen(sel: torch.Tensor) -> torch.Tensor:  # [n, Hkv, nb] bool
        m = torch.zeros(n, hkv, nb + 1, dtype=torch.bool, device=dev)
        m.scatter_(2, torch.where(sel >= 0, sel.long(), nb), True)
        return m[..., :nb]

    sel_m, orc_m = chosen(ids), chosen(oracle)
    m_sel, m_orc = (mass * sel_m).sum(-1), (mass * orc_m).sum(-1)
    history = orc_m & (bid[None, :] < own[:, None])[:, None, :]
    floor = mass.masked_fill(~history, float("inf")).amin(-1, keepdim=True)  # oracle's smallest kept mass
    hit = orc_m | (mass >= floor - _TIE) & (bid < own[:, None, None])
    recall = (sel_m & hit).sum(-1) / orc_m.sum(-1)
    far = ((bid >= 1) & (bid[None, :] <= own[:, None] - 2))[:, None, :]  # [n, 1, nb]
    n_far = (orc_m & far).sum(-1)
    far_recall = ((sel_m & hit & far).sum(-1) / n_far.clamp(min=1)).clamp(max=1.0)
    far_recall = far_recall.masked_fill(n_far == 0, float("nan"))
    starts = bid * block
    valid = (pos[:, None] + 1 - starts[None, :]).clamp(0, block)  # [n, nb] keys of each block up to pos
    keys = (sel_m * valid[:, None, :]).sum(-1) / (pos[:, None] + 1)
    local = mass.gather(2, own.view(n, 1, 1).expand(n, hkv, 1))[..., 0]
    out = torch.stack([recall.clamp(max=1.0), (m_sel / m_orc.clamp(min=1e-30)).clamp(max=1.0), m_sel, keys, local,
                       far_recall])
    return out.float().clamp(0.0, 1.0)  # clamp keeps NaN


class SelectionTelemetry:
    """One request's accumulator (the engine keeps it on the `Sequence`; MSA layers add to it).

    Values are kept as they come (`_rows`: views of the layer's measured tensors, on the device) and summed once,
    in `summary()`: adding them on arrival cost about 80 small kernels per request, layer and decode step (a
    decode step of 64 requests on 30 layers launched some 150 000), so a telemetry run decoded many times slower
    than the attention it measures."""

    def __init__(self, prompt_len: int, config: TelemetryConfig | None = None):
        self.config = config or TelemetryConfig()
        self.prompt_len = prompt_len
        self.probe_from = max(0, prompt_len - self.config.probe_queries)
        # (layer, first metric, values [metrics, n, Hkv]; NaN: no value), summed per layer in summary()
        self._rows: list[tuple[int, int, torch.Tensor]] = []
        self._first_layer: int | None = None  # the lowest MSA layer seen: rows are counted there, once per forward
        self.prefill_probes = self.decode_tokens = 0
        self._last_layer: tuple[int, int, torch.Tensor] | None = None  # (layer, first pos, ids) of this forward
        self._last_token: dict[int, tuple[int, torch.Tensor]] = {}  # layer -> (pos, ids [Hkv, k]) of the last row

    def observe(self, layer: int, q: torch.Tensor, k: torch.Tensor, pos0: int, ids: torch.Tensor, block: int,
                topk: int, scale: float) -> None:
        """This request's rows of one MSA layer call: q `[ql, Hq, d]` at positions pos0.., keys `[Hkv, S, d]`,
        ids `[ql, Hkv, topk]`."""
        skip = max(0, self.probe_from - pos0)
        if skip >= q.shape[0]:
            return
        q, ids, pos0 = q[skip:], ids[skip:].clone(), pos0 + skip  # a decode plan reuses its ids buffer
        n, hq, s, hkv = q.shape[0], q.shape[1], k.shape[1], k.shape[0]
        pos = torch.arange(pos0, pos0 + n, device=q.device)
        chunk = max(1, chunk_elements(q.device) // (hq * s))
        rows = torch.cat([row_metrics(block_mass(dense_probs(q[c:c + chunk], k, pos[c:c + chunk], scale), hkv, block),
                                      pos[c:c + chunk], ids[c:c + chunk], block, topk) for c in range(0, n, chunk)],
                         dim=1)
        self.record(layer, pos0, ids, rows)

    def record(self, layer: int, pos0: int, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Add the measured probe rows (`row_metrics`' `[6, n, Hkv]`) at positions pos0.. with their ids (kept)."""
        n = ids.shape[0]
        self._rows.append((layer, 0, rows))
        prev = self._last_layer
        if prev is not None and prev[0] < layer and prev[1] == pos0 and prev[2].shape == ids.shape:
            self._rows.append((prev[0], _LAYER_OVERLAP, overlap(prev[2], ids)[None]))
        last = self._last_token.get(layer)
        dec = max(0, self.prompt_len - pos0)  # rows from here on are decode tokens
        if dec < n:
            before = ids[dec - 1:n - 1] if dec > 0 else None
            if before is None and last is not None and last[0] == pos0 - 1:
                before = torch.cat([last[1][None], ids[:n - 1]])
            if before is not None:
                first = n - before.shape[0]
                self._rows.append((layer, _DECODE_OVERLAP, overlap(ids[first:], before)[None]))
        self._seen(layer, pos0, ids)

    def _seen(self, layer: int, pos0: int, ids: torch.Tensor) -> None:
        """After layer's rows at pos0.. (ids `[n, Hkv, k]`): remember them, count the rows once per forward."""
        n = ids.shape[0]
        self._last_layer = (layer, pos0, ids)
        self._last_token[layer] = (pos0 + n - 1, ids[-1])
        if self._first_layer is None or layer < self._first_layer:
            self._first_layer = layer
        if layer == self._first_layer:  # the first MSA layer of a forward
            self.prefill_probes += max(0, min(n, self.prompt_len - pos0))
            self.decode_tokens += max(0, n - max(0, self.prompt_len - pos0))

    def summary(self) -> dict[str, object]:
        """The record's `msa_telemetry` (module docstring): the kept rows summed per layer (NaN: no value)."""
        groups: dict[tuple[int, int, int], list[torch.Tensor]] = {}
        for layer, first, vals in self._rows:
            groups.setdefault((layer, first, vals.shape[0]), []).append(vals)
        layers = sorted({layer for layer, _, _ in groups})
        hkv = self._rows[0][2].shape[2] if self._rows else 0
        sums = {layer: torch.zeros(len(METRICS), hkv, dtype=torch.float64) for layer in layers}
        counts = {layer: torch.zeros_like(sums[layer]) for layer in layers}
        for (layer, first, m), parts in groups.items():
            vals = torch.cat(parts, dim=1).double().cpu()  # [m, rows, Hkv]
            has = ~torch.isnan(vals)
            sums[layer][first:first + m] += torch.where(has, vals, 0).sum(1)
            counts[layer][first:first + m] += has.sum(1)
        per: dict[str, list] = {m: [] for m in METRICS}
        for layer in layers:
            for i, m in enumerate(METRICS):
                row = [round(float(v) / float(c), 4) if c else None
                       for v, c in zip(sums[layer][i], counts[layer][i], strict=True)]
                per[m].append(row if any(v is not None for v in row) else None)
        mean = {}
        for m in METRICS:
            cells = [v for row in per[m] if row is not None for v in row if v is not None]
            mean[m] = round(sum(cells) / len(cells), 4) if cells else None
        out: dict[str, object] = {"version": VERSION, "probe_queries": self.config.probe_queries,
                                  "prefill_probes": self.prefill_probes, "decode_tokens": self.decode_tokens,
                                  "decode": "eager", "layers": layers, **per, "mean": mean}
        if all(row is None for row in per["decode_overlap"]):
            out["decode_overlap"] = None  # no decode token had a previous one
        return out


def observe_layer(layer: int, q: torch.Tensor, k_cache: torch.Tensor, ids: torch.Tensor, meta: AttentionMeta,
                  topk: int, scale: float, last: bool = False) -> None:
    """One MSA layer call: each request of the batch with an accumulator in `meta.telemetry` adds its probe rows.
    q `[T, Hq, d]`, k_cache `[pages, Hkv, B, d]`, ids `[T, Hkv, topk]` (logical blocks, -1 padding). The prompt
    chunks are measured one request at a time, now; the requests with one probe query this step (decode tokens,
    whatever else the step holds) at once: their block masses now (`_block_masses`), the metrics of every layer
    of the forward in one batch when the forward's last MSA layer (`last`) has been seen (`_flush`)."""
    accs = meta.telemetry or []
    if not accs:
        return
    one = single_query_rows(meta, lambda r: accs[r] is not None and meta.kv_lens[r] - 1 >= accs[r].probe_from)
    if one is not None:
        # a decode step's ids are a view of the decode plan's buffer (reused next step): a copy; indexing copies
        sel = ids[one.at].clone() if one.every else ids[one.at]
        mass = _block_masses(q[one.at], k_cache, one.kv_lens, one.page_table, scale)
        meta.telemetry_pending.append((layer, mass, sel, one.kv_lens, [accs[r] for r in one.reqs]))
    batched = set(one.reqs) if one is not None else set()
    start = 0
    for r, (ql, kl) in enumerate(zip(meta.q_lens, meta.kv_lens, strict=True)):
        acc = accs[r]
        if acc is not None and kl > acc.probe_from and r not in batched:
            k = gather_kv(k_cache, meta.page_lists[r], kl)
            acc.observe(layer, q[start:start + ql], k, kl - ql, ids[start:start + ql], k_cache.shape[2], topk, scale)
        start += ql
    if last:
        _flush(meta, k_cache.shape[2], topk)


def _block_masses(q: torch.Tensor, k_cache: torch.Tensor, kv_lens: list[int], page_table: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Requests of one query each (q `[R, Hq, d]`, their lengths and page-table rows) -> their block masses
    `[R, Hkv, nb]` (`block_mass`), every request at once (`engine.msa.recall.decode_step_probs`, chunks of at
    most `chunk_elements` elements)."""
    hkv, block = k_cache.shape[1], k_cache.shape[2]
    return torch.cat([block_mass(p, hkv, block) for _, _, _, p in
                      decode_step_probs(q, k_cache, kv_lens, page_table, scale, chunk_elements(q.device))])


def _flush(meta: AttentionMeta, block: int, topk: int) -> None:
    """The forward's batched rows (`meta.telemetry_pending`, one entry per MSA layer): `row_metrics` of every layer
    at once, then each layer's rows handed over in layer order (`_record_decode`). A loop over 64 requests x 27
    layers made a telemetry run several times slower than the attention it measures; one `row_metrics` per layer
    still cost ~110 kernels per layer and decode step."""
    pending, meta.telemetry_pending = meta.telemetry_pending, []
    groups: dict[tuple, list] = {}  # the same requests and block count in every layer of a forward, in practice
    for entry in pending:
        layer, mass, sel, kv_lens, accs = entry
        groups.setdefault((tuple(map(id, accs)), mass.shape), []).append(entry)
    for group in groups.values():
        kv_lens, mass0 = group[0][3], group[0][1]
        pos = torch.tensor(kv_lens, device=mass0.device) - 1
        n = len(kv_lens)
        per = max(1, chunk_elements(mass0.device) // mass0.numel())  # layers per row_metrics call
        for c in range(0, len(group), per):
            entries = group[c:c + per]
            rows = row_metrics(torch.cat([e[1] for e in entries]), pos.repeat(len(entries)),
                               torch.cat([e[2] for e in entries]), block, topk)  # [6, layers * n, Hkv]
            for i, (layer, _, sel, _, accs) in enumerate(entries):
                _record_decode(layer, rows[:, i * n:(i + 1) * n], sel, kv_lens, accs)


def _record_decode(layer: int, rows: torch.Tensor, ids: torch.Tensor, kv_lens: list[int],
                   accs: list[SelectionTelemetry]) -> None:
    """One layer's measured rows (`row_metrics`' `[6, R, Hkv]`) of requests with one query each (ids `[R, Hkv, k]`,
    their lengths and accumulators), with their layer and decode overlaps computed at once, handed to each
    accumulator as views."""
    pos0 = [kl - 1 for kl in kv_lens]
    prev = [a._last_layer for a in accs]
    last = [a._last_token.get(layer) for a in accs]
    # layer_overlap: the previous MSA layer of this forward; decode_overlap: the previous token of this layer
    same_forward = [p is not None and p[0] < layer and p[1] == q0 and p[2].shape == ids[:1].shape
                    for p, q0 in zip(prev, pos0, strict=True)]
    after_token = [a.prompt_len <= q0 and t is not None and t[0] == q0 - 1
                   for a, t, q0 in zip(accs, last, pos0, strict=True)]
    if len(set(same_forward)) > 1 or len(set(after_token)) > 1:
        for r, acc in enumerate(accs):  # requests at different stages: one at a time
            acc.record(layer, pos0[r], ids[r:r + 1], rows[:, r:r + 1])
        return
    nan = torch.full_like(rows[:1], float("nan"))
    do = overlap(ids, torch.stack([t[1] for t in last]))[None] if after_token[0] else nan  # type: ignore[index]
    vals = torch.cat([rows, nan, do])  # [8, n, Hkv]: every metric of this layer (layer_overlap: NaN)
    lo = overlap(torch.cat([p[2] for p in prev]), ids)[None] if same_forward[0] else None  # type: ignore[index]
    for r, acc in enumerate(accs):  # views only: no kernel per request
        acc._rows.append((layer, 0, vals[:, r:r + 1]))
        if lo is not None:
            acc._rows.append((prev[r][0], _LAYER_OVERLAP, lo[:, r:r + 1]))  # type: ignore[index]
        acc._seen(layer, pos0[r], ids[r:r + 1])
