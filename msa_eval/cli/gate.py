"""`msa-eval gate RUN_A [RUN_B]`: the accuracy gate, for a serving stack's CI (exit 1 on FAIL)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from msa_eval import display

if TYPE_CHECKING:
    from msa_eval.report.load import LoadedRun


@click.command()
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", required=False, type=click.Path(path_type=Path))
@click.option("--arms", "arms", multiple=True, metavar="A_ARM,B_ARM",
              help="The arms to compare: A's arm (in RUN_A) and B's (in RUN_B, or in RUN_A when only one "
                   "run is given), as backend keys (local:msa) or their part after the colon (msa). "
                   "Repeat for more pairs. Default: two runs pair the arms they share (or their only "
                   "arms); one run pairs each msa* arm with dense.")
@click.option("--max-drop", type=click.FloatRange(min=0), default=2.0, show_default=True, metavar="POINTS",
              help="The drop of A below B (points, scores 0-100) that a cell tolerates.")
@click.option("--alpha", type=click.FloatRange(0, 0.5, min_open=True, max_open=True), default=0.05,
              show_default=True, help="One-sided significance level of each cell's test.")
@click.option("--bootstrap", type=click.IntRange(min=100), default=2000, show_default=True,
              help="Bootstrap resamples per cell.")
@click.option("--shared-samples", is_flag=True,
              help="Gate the samples both arms hold (an unfinished run) instead of refusing arms whose sample "
                   "sets differ; a line says how many were left out. Prompt hashes must still agree.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.pass_context
def gate(ctx: click.Context, run_a: Path, run_b: Path | None, arms: tuple[str, ...], max_drop: float,
         alpha: float, bootstrap: int, shared_samples: bool, as_json: bool) -> None:
    """Per task x length, is arm A significantly more than POINTS below arm B on the same samples?

    A cell FAILs when the upper bound of the (1 - 2 alpha) paired bootstrap interval of
    mean(A - B) is below -POINTS and the exact one-sided sign test (McNemar's on 0/1 scores)
    that A is below B has p < alpha; the gate PASSes when no cell fails. Both runs must hold
    the same samples (ids and prompt hashes), from any backends. Exit code: 0 PASS, 1 FAIL,
    2 bad input.

    \b
    msa-eval gate RUN                          # each msa* arm vs dense in one run
    msa-eval gate RUN --arms msa,msa-oracle    # two named arms of one run
    msa-eval gate RUN_A RUN_B                  # same arms of two runs (or their only arms)
    msa-eval gate RUN_A RUN_B --arms msa,dense # A's msa vs B's dense
    msa-eval gate RUN_A RUN_B --shared-samples # one run unfinished: the samples both hold
    """
    from msa_eval.errors import MsaEvalError
    from msa_eval.report.gate import GateConfig, resolve_pairs, run_gate

    names = []
    for spec in arms:
        parts = [p.strip() for p in spec.split(",")]
        if len(parts) != 2 or not all(parts):
            raise MsaEvalError(f"bad --arms {spec!r}: give two arm names, A's and B's, e.g. --arms msa,dense")
        names.append((parts[0], parts[1]))
    loaded_a = _load(run_a)
    loaded_b = _load(run_b) if run_b is not None else None
    cfg = GateConfig(max_drop=max_drop, alpha=alpha, n_boot=bootstrap, shared_only=shared_samples)
    pairs = resolve_pairs(loaded_a, loaded_b, names)
    result = run_gate(pairs, cfg)
    if as_json:
        display.print_json(result.to_dict())
    else:
        display.table(f"msa-eval gate: A - B per cell ({1 - 2 * alpha:.0%} bootstrap interval; exact test)",
                      ("A arm", "B arm", "task", "length", "n", "A score", "B score", "Δ A−B [interval]",
                       "A>B / A<B", "p (A<B)", "verdict"),
                      [(c.a, c.b, c.task, c.column, c.n, f"{c.score_a:.1f}", f"{c.score_b:.1f}",
                        f"{c.delta:+.1f} [{c.lo:+.1f}, {c.hi:+.1f}]", f"{c.wins} / {c.losses}",
                        f"{c.test} {c.p_drop:.3g}", c.verdict) for c in result.cells])
        display.stream_text(result.summary() + "\n")
    if note := result.error_note():
        display.warning_line(note)
    for a, b in pairs if shared_samples else ():
        if left := len(set(a.records) ^ set(b.records)):
            display.warning_line(f"{a.label} vs {b.label}: {left} samples held by one arm only were left out "
                                 "(--shared-samples)")
    if result.failed:
        ctx.exit(1)


def _load(run_dir: Path) -> LoadedRun:
    """One run's records (`load_run_with_records`: none is bad input, exit 2); skipped lines said."""
    from msa_eval.report.load import load_run_with_records

    run = load_run_with_records(run_dir)
    if warning := run.warning():
        display.warning_line(warning)
    return run
