"""`msa-eval report RUN_DIR...`: side-by-side tables (Markdown, CSV, JSON) and PNG plots."""
from __future__ import annotations

from pathlib import Path

import click

from msa_eval import display


def register(group: click.Group) -> None:
    group.add_command(report)


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Folder for report.md/.csv/.json and plots (default: <first run>/report).")
@click.option("--format", "formats", default="md,csv,json", show_default=True,
              help="Files to write: any of md, csv, json (comma-separated).")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots.")
@click.option("--bootstrap", type=int, default=1000, show_default=True, help="Bootstrap resamples for the Δ CIs.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--markdown", "as_md", is_flag=True, help="Print the report as Markdown.")
def report(run_dirs: tuple[Path, ...], out: Path | None, formats: str, no_plots: bool, bootstrap: int,
           as_json: bool, as_md: bool) -> None:
    """Join the runs in RUN_DIRS side by side (columns = backend @ length)."""
    from msa_eval.errors import MsaEvalError
    from msa_eval.report import build_report, load_runs
    from msa_eval.report.plots import plot_report
    from msa_eval.report.writers import to_markdown, write_report

    records = load_runs(list(run_dirs))
    if not records:
        raise MsaEvalError(f"no records in {', '.join(map(str, run_dirs))}: run `msa-eval run` first")
    rep = build_report(records, n_boot=bootstrap)
    dest = out or Path(run_dirs[0]) / "report"
    wanted = {f.strip() for f in formats.split(",") if f.strip()}
    if not wanted or wanted - {"md", "csv", "json"}:
        raise MsaEvalError(f"bad --format {formats!r}: use a comma-separated subset of md,csv,json")
    paths = write_report(rep, dest, wanted)
    if not no_plots:
        plot_report(rep, records, dest)
    if as_json:
        display.print_json(rep.to_dict())
    elif as_md:
        display.stream_text(to_markdown(rep))
    else:
        display.report_tables(rep)
        display.info(f"[dim]written: {', '.join(str(p) for p in paths.values())}[/]")
