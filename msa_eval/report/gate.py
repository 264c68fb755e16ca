"""The accuracy gate: is arm A significantly more than `max_drop` points below arm B anywhere?

Cells are task x length, paired over the same samples (same sample ids and prompt hashes, so
runs from any backend compare: an endpoint on vLLM against a hosted API, MSA against dense).

Decision rule, per cell, one-sided at level alpha: FAIL when both
  1. the upper bound of the (1 - 2 alpha) paired percentile bootstrap interval of mean(A - B)
     (`stats.paired_bootstrap`, i.e. the one-sided 1 - alpha upper bound) is below -max_drop, and
  2. the exact one-sided sign test (McNemar's on 0/1 scores) that A is below B has p < alpha.
(1) tests "the drop exceeds max_drop"; (2) keeps a handful of samples from failing a cell: the
percentile bootstrap has a zero-width interval when every difference is the same (3 of 3 lost
gives [-100, -100]), while the exact test needs 5 of 5 discordant pairs at alpha 0.05. With
max_drop 0 the rule is about the exact test alone on small cells. A cell passes otherwise;
the gate passes when no cell fails."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from msa_eval.errors import MsaEvalError
from msa_eval.report.build import Report, _pairs
from msa_eval.report.load import LoadedRun
from msa_eval.report.stats import paired_bootstrap, sign_test
from msa_eval.runner.records import SampleRecord

CellKey = tuple[str, int, str]  # (task, length, sample_id)


@dataclass(frozen=True)
class GateConfig:
    max_drop: float = 2.0  # points (scores 0-100)
    alpha: float = 0.05  # one-sided level of each cell's test
    n_boot: int = 2000
    seed: int = 0
    shared_only: bool = False  # gate the samples both arms hold (an unfinished run), not refuse the pair


@dataclass(frozen=True)
class Arm:
    """One backend's records in one run, keyed by (task, length, sample_id)."""

    run_dir: Path
    backend: str
    records: dict[CellKey, SampleRecord]

    @property
    def label(self) -> str:
        return f"{self.run_dir}:{self.backend}"


@dataclass(frozen=True)
class CellVerdict:
    a: str  # arm labels (run dir:backend)
    b: str
    task: str
    length: int
    n: int
    score_a: float  # 0-100
    score_b: float
    delta: float  # mean(A - B), points
    lo: float  # (1 - 2 alpha) bootstrap interval, points
    hi: float
    wins: int  # samples where A > B
    losses: int  # samples where A < B
    test: str  # mcnemar | sign
    p: float  # two-sided exact p
    p_drop: float  # one-sided exact p of "A below B"
    errors_a: int  # records with status error (scored 0, as in the report)
    errors_b: int
    verdict: str  # PASS | FAIL

    @property
    def column(self) -> str:
        return length_label(self.length)


def length_label(n: int) -> str:
    """2048 -> 2k, 3000 -> 3000 (the report's column suffix)."""
    return Report.col("", n).removeprefix("@")


def arm(run: LoadedRun, name: str) -> Arm:
    """The arm `name` of `run`: a backend key (`local:msa`) or its part after the backend kind
    (`msa`), which must then be unique."""
    keys = sorted({r.backend for r in run.records})
    hits = [k for k in keys if k == name] or [k for k in keys if k.partition(":")[2] == name]
    if len(hits) != 1:
        why = "matches several" if hits else "is not an arm of"
        raise MsaEvalError(f"arm {name!r} {why} {run.run_dir} (arms: {', '.join(keys)}): "
                           "name one of them, e.g. --arms msa,dense")
    return _arm(run, hits[0])


def _arm(run: LoadedRun, backend: str) -> Arm:
    recs = {(r.task, r.length, r.sample_id): r for r in run.records if r.backend == backend}
    return Arm(run.run_dir, backend, recs)


def resolve_pairs(run_a: LoadedRun, run_b: LoadedRun | None,
                  arms: Iterable[tuple[str, str]] = ()) -> list[tuple[Arm, Arm]]:
    """The (A, B) arm pairs to gate. `arms` names them (A's arm in run_a, B's in run_b or, with
    one run, in run_a). Without names: two runs pair each backend key they share, or their only
    arms when each has one; one run pairs each `msa*` arm with its `dense` arm, as the report does."""
    other = run_b or run_a
    arms = list(arms)
    if arms:
        return [(arm(run_a, x), arm(other, y)) for x, y in arms]
    keys_a = sorted({r.backend for r in run_a.records})
    keys_b = sorted({r.backend for r in other.records})
    if run_b is None:
        pairs = _pairs(keys_a)
        if not pairs:
            raise MsaEvalError(f"{run_a.run_dir} has no msa/dense pair of arms (arms: {', '.join(keys_a)}): "
                               "name the two with --arms A,B")
        return [(_arm(run_a, x), _arm(run_a, y)) for x, y in pairs]
    shared = [k for k in keys_a if k in keys_b]
    if shared:
        return [(_arm(run_a, k), _arm(run_b, k)) for k in shared]
    if len(keys_a) == 1 and len(keys_b) == 1:
        return [(_arm(run_a, keys_a[0]), _arm(run_b, keys_b[0]))]
    raise MsaEvalError(f"{run_a.run_dir} (arms: {', '.join(keys_a)}) and {run_b.run_dir} (arms: "
                       f"{', '.join(keys_b)}) share no arm: name the two with --arms A_ARM,B_ARM")


def check_same_prompts(a: Arm, b: Arm, shared_only: bool = False) -> list[CellKey]:
    """The (task, length, sample id)s to pair. Refuses a pair whose samples differ: both must hold
    the same keys (`shared_only`: the keys both hold, at least one) with the same prompt hashes.
    Names the first mismatching cell."""
    keys = sorted(set(a.records) | set(b.records), key=lambda k: (k[0], k[1], k[2]))
    shared = []
    for key in keys:
        ra, rb = a.records.get(key), b.records.get(key)
        task, length, sid = key
        cell = f"{task} @{length_label(length)} sample {sid}"
        if ra is None or rb is None:
            if shared_only:
                continue
            where = b.label if ra is None else a.label
            raise MsaEvalError(f"{a.label} and {b.label} do not share prompts: {cell} is only in {where}; "
                               "the gate pairs runs of the same suite, tasks, lengths, samples and seed: "
                               "rerun one with the other's settings (or resume the unfinished one), or pass "
                               "--shared-samples to gate the samples both hold")
        if ra.prompt_hash != rb.prompt_hash:
            raise MsaEvalError(f"{a.label} and {b.label} do not share prompts: {cell} has prompt hash "
                               f"{ra.prompt_hash} vs {rb.prompt_hash}; the gate pairs runs of the same "
                               "suite, tasks, lengths, samples and seed: rerun one with the other's settings")
        shared.append(key)
    if not shared:
        raise MsaEvalError(f"{a.label} and {b.label} share no sample: the gate pairs runs of the same suite, "
                           "tasks, lengths, samples and seed")
    return shared


def gate_pair(a: Arm, b: Arm, cfg: GateConfig) -> list[CellVerdict]:
    """The verdict of every task x length cell of the pair (on the keys `check_same_prompts` gives)."""
    cells: dict[tuple[str, int], list[CellKey]] = {}
    for key in check_same_prompts(a, b, cfg.shared_only):
        cells.setdefault(key[:2], []).append(key)
    out = []
    for (task, length), keys in sorted(cells.items()):
        sa = [a.records[k].score for k in keys]
        sb = [b.records[k].score for k in keys]
        delta, lo, hi = paired_bootstrap(sa, sb, n_boot=cfg.n_boot, seed=cfg.seed, alpha=2 * cfg.alpha)
        t = sign_test(sa, sb)
        fail = round(100 * hi, 9) < -cfg.max_drop and t.p_less < cfg.alpha  # round: k/n sums, not noise
        out.append(CellVerdict(
            a.label, b.label, task, length, len(keys), _pts(sum(sa) / len(sa)), _pts(sum(sb) / len(sb)),
            _pts(delta), _pts(lo), _pts(hi), t.wins, t.losses, t.test, t.p, t.p_less,
            sum(a.records[k].status == "error" for k in keys), sum(b.records[k].status == "error" for k in keys),
            "FAIL" if fail else "PASS"))
    return out


def _pts(x: float) -> float:
    return round(100 * x, 1)


@dataclass(frozen=True)
class GateResult:
    cfg: GateConfig
    cells: list[CellVerdict]

    @property
    def failed(self) -> int:
        return sum(c.verdict == "FAIL" for c in self.cells)

    @property
    def verdict(self) -> str:
        return "FAIL" if self.failed else "PASS"

    def summary(self) -> str:
        n = len(self.cells)
        return (f"gate: {self.verdict}: {self.failed} of {n} cell{'s' * (n != 1)} fail "
                f"(FAIL = A more than {self.cfg.max_drop:g} points below B, one-sided at alpha "
                f"{self.cfg.alpha:g}: bootstrap bound and exact test)")

    def error_note(self) -> str | None:
        """A line when harness errors (scored 0, as in the report) are in the compared records."""
        ea, eb = sum(c.errors_a for c in self.cells), sum(c.errors_b for c in self.cells)
        if not ea and not eb:
            return None
        return (f"{ea} of A's and {eb} of B's compared records are harness errors, scored 0: rerun their "
                "`msa-eval run` commands to retry them before trusting the verdict")

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "failed": self.failed, "cells_total": len(self.cells),
                "config": asdict(self.cfg), "cells": [asdict(c) for c in self.cells]}


def run_gate(pairs: list[tuple[Arm, Arm]], cfg: GateConfig) -> GateResult:
    return GateResult(cfg, [c for a, b in pairs for c in gate_pair(a, b, cfg)])
