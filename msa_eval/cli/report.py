"""`msa-eval report RUN_DIR...`: side-by-side tables (Markdown, CSV, JSON) and PNG plots."""
from __future__ import annotations

from pathlib import Path

import click

from msa_eval import display


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
    """Join the runs in RUN_DIRS side by side (columns = backend @ length); agent batch runs
    (`msa-eval run agents`) get their own table (agents.md/.csv/.json)."""
    from msa_eval.errors import MsaEvalError
    from msa_eval.report.agents import is_agent_run

    wanted = {f.strip() for f in formats.split(",") if f.strip()}
    if not wanted or wanted - {"md", "csv", "json"}:
        raise MsaEvalError(f"bad --format {formats!r}: use a comma-separated subset of md,csv,json")
    dest = out or Path(run_dirs[0]) / "report"
    agent_dirs = [d for d in run_dirs if is_agent_run(d)]
    helmet_dirs = [d for d in run_dirs if d not in agent_dirs]
    if not agent_dirs:
        _helmet(helmet_dirs, dest, wanted, no_plots, bootstrap, as_json, as_md)
        return
    from msa_eval.report.agents import (
        agents_markdown,
        build_agent_report,
        load_agent_runs,
        require_records,
        write_agent_report,
    )

    records = load_agent_runs(agent_dirs)
    require_records(records, agent_dirs)
    agents = build_agent_report(records)
    rep = _helmet(helmet_dirs, dest, wanted, no_plots, bootstrap, as_json, as_md, show=False) if helmet_dirs else None
    paths = write_agent_report(agents, dest, wanted, plots=not no_plots)
    if as_json:
        display.print_json({"helmet": rep.to_dict(), "agents": agents.to_dict()} if rep else agents.to_dict())
        return
    if rep is not None:
        if as_md:
            from msa_eval.report.writers import to_markdown

            display.stream_text(to_markdown(rep) + "\n")
        else:
            display.report_tables(rep)
    display.stream_text(agents_markdown(agents))
    if not as_md:
        display.info(f"written: {', '.join(str(p) for p in paths.values())}", dim=True)


def _helmet(run_dirs, dest: Path, wanted: set[str], no_plots: bool, bootstrap: int, as_json: bool,
            as_md: bool, show: bool = True):
    """The HELMET report over `run_dirs`: write its files (and plots); print it when `show`."""
    from msa_eval.errors import MsaEvalError
    from msa_eval.report import build_report, load_runs
    from msa_eval.report.plots import plot_report
    from msa_eval.report.writers import to_markdown, write_report

    warnings: list[str] = []
    records = load_runs(list(run_dirs), warn=warnings.append)
    if not records:  # one line: the skipped lines are the likely reason
        why = f" ({'; '.join(warnings)})" if warnings else ""
        raise MsaEvalError(f"no records in {', '.join(map(str, run_dirs))}: run `msa-eval run` first{why}")
    for w in warnings:
        display.warning_line(w)
    rep = build_report(records, n_boot=bootstrap)
    paths = write_report(rep, dest, wanted)
    if not no_plots:
        plot_report(rep, records, dest)
    if not show:
        return rep
    if as_json:
        display.print_json(rep.to_dict())
    elif as_md:
        display.stream_text(to_markdown(rep))
    else:
        display.report_tables(rep)
        display.info(f"written: {', '.join(str(p) for p in paths.values())}", dim=True)
    return rep
