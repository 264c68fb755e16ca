"""Selection telemetry in the report: the records' `msa_telemetry` (written by local MSA arms,
`engine/msa/telemetry.py`) averaged per arm x task x length, per layer, and per layer x needle depth.

Every value is a mean over samples of the sample's mean over its MSA layers and KV groups (probe queries:
the last P prompt positions and every decode token, decode run eagerly); 0-1 fractions, rounded to 4 digits.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from msa_eval.runner.records import SampleRecord

METRICS = ("recall", "far_recall", "mass_recall", "keys_read", "local_share", "layer_overlap", "decode_overlap")
FIELDS = ("backend", "task", "length", *METRICS, "samples")
DEPTH_BINS = 10  # needle depth 0..1 in tenths


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def _cells(records: list[SampleRecord]) -> dict[tuple[str, str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.msa_telemetry:
            out[(r.backend, r.task, r.length)].append(r.msa_telemetry)
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])))


def telemetry_rows(records: list[SampleRecord]) -> list[dict[str, Any]]:
    """One row per arm x task x length with telemetry: the mean of each metric over its samples, and `samples`."""
    rows = []
    for (b, t, n), tels in _cells(records).items():
        row: dict[str, Any] = {"backend": b, "task": t, "length": n}
        for m in METRICS:
            row[m] = _mean([x["mean"][m] for x in tels if x.get("mean", {}).get(m) is not None])
        row["samples"] = len(tels)
        rows.append(row)
    return rows


def layer_means(tel: dict[str, Any], metric: str = "recall") -> dict[int, float]:
    """One sample's {layer: mean over KV groups} of `metric` (layers and groups without a value left out)."""
    vals = [[v for v in g if v is not None] if g else None for g in tel.get(metric) or []]
    return {layer: sum(g) / len(g) for layer, g in zip(tel.get("layers", []), vals, strict=False) if g}


def telemetry_layers(records: list[SampleRecord]) -> list[dict[str, Any]]:
    """Per arm x task x length: the MSA layers and, per layer, recall and mass recall (means over samples)."""
    out = []
    for (b, t, n), tels in _cells(records).items():
        entry: dict[str, Any] = {"backend": b, "task": t, "length": n, "samples": len(tels)}
        layers = sorted({layer for x in tels for layer in x.get("layers", [])})
        entry["layers"] = layers
        for m in ("recall", "far_recall", "mass_recall", "keys_read", "layer_overlap"):
            per = [layer_means(x, m) for x in tels]
            entry[m] = [_mean([p[layer] for p in per if layer in p]) for layer in layers]
        out.append(entry)
    return out


def recall_by_layer_depth(records: list[SampleRecord], backend: str, length: int
                          ) -> tuple[list[int], list[list[float | None]]]:
    """(MSA layers, grid[depth bin][layer] = mean recall) over the samples of `backend` at `length` that
    record a needle depth and telemetry; an empty cell is None."""
    rs = [(r.depth, r.msa_telemetry) for r in records if r.backend == backend and r.length == length
          and r.msa_telemetry and r.depth is not None]
    layers = sorted({layer for _, tel in rs for layer in tel.get("layers", [])})
    acc: dict[tuple[int, int], list[float]] = defaultdict(list)
    for depth, tel in rs:
        i = min(DEPTH_BINS - 1, int(depth * DEPTH_BINS))
        for layer, v in layer_means(tel).items():
            acc[(i, layer)].append(v)
    grid = [[_mean(acc[(i, layer)]) if acc.get((i, layer)) else None for layer in layers]
            for i in range(DEPTH_BINS)]
    return layers, grid
