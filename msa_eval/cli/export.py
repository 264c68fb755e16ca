"""`msa-eval export RUN_DIR --format parquet|jsonl|hf|inspect --out PATH`: a run's records as a
`datasets.Dataset` (parquet, jsonl, hf) or as inspect-ai eval logs (inspect)."""
from __future__ import annotations

from pathlib import Path

import click

from msa_eval import display

# msa_eval.export.FORMATS and inspect (not imported here: --help stays light)
_FORMATS = ("parquet", "jsonl", "hf", "inspect")


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(_FORMATS, case_sensitive=False), required=True,
              help="hf: a datasets.save_to_disk folder (datasets.load_from_disk reads it); parquet: one "
                   "parquet file; jsonl: one JSON-lines file; inspect: a folder of inspect-ai eval logs, one "
                   ".eval per backend (inspect_ai.log.read_eval_log, `inspect view --log-dir PATH`).")
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Where to write it.")
@click.option("--force", is_flag=True, help="Replace an existing PATH (only once the new output is complete).")
def export(run_dir: Path, fmt: str, out: Path, force: bool) -> None:
    """Write the records of RUN_DIR (a folder made by `msa-eval run`) as a Hugging Face dataset:
    one row per (backend, sample), the last record of each; columns in docs/records.md. Or, with
    --format inspect, as inspect-ai eval logs: one per backend, one sample per record.

    \b
    msa-eval export runs/RUN --format hf --out runs/RUN.ds          # datasets.load_from_disk
    msa-eval export runs/RUN --format parquet --out RUN.parquet     # Dataset.from_parquet, pandas, duckdb
    msa-eval export runs/RUN --format jsonl --out RUN.jsonl --force # replace an earlier export
    msa-eval export runs/RUN --format inspect --out RUN.logs        # inspect view --log-dir RUN.logs
    """
    from msa_eval.errors import MsaEvalError
    from msa_eval.export import import_datasets, records_dataset, write_dataset
    from msa_eval.report.agents import is_agent_run
    from msa_eval.report.load import load_run_with_records

    fmt = fmt.lower()
    if is_agent_run(run_dir):
        raise MsaEvalError(f"{run_dir} is an agent run (`msa-eval run agents`): export writes the sample records "
                           f"of `msa-eval run SUITE`; `msa-eval report {run_dir}` reads agent runs")
    run = load_run_with_records(run_dir)
    if out.resolve() == run_dir.resolve() or out.resolve() in run_dir.resolve().parents:
        raise MsaEvalError(f"--out {out} would replace the run directory {run_dir}: choose a path outside it")
    if warning := run.warning():
        display.warning_line(warning)
    n = len(run.records)
    if fmt == "inspect":
        from msa_eval.inspect_log import write_inspect_logs

        path = write_inspect_logs(run.records, run.manifest, run_dir, out, force=force)
        logs = len({r.backend for r in run.records})
        display.info(f"{n} record{'s' * (n != 1)} of {run_dir} written as {logs} inspect eval "
                     f"log{'s' * (logs != 1)}: {path}")
        return
    import_datasets().disable_progress_bars()  # the one line below says what was written
    path = write_dataset(records_dataset(run.records), fmt, out, force=force)
    display.info(f"{n} record{'s' * (n != 1)} of {run_dir} written as {fmt}: {path}")
