"""Read run directories: manifest + records, last record per (backend, sample) wins.

Read only: unreadable lines of records.jsonl (a run still appending, a kill -9, garbage) are
skipped and counted, never rewritten; `msa-eval run` repairs them when it reopens the run."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msa_eval.errors import MsaEvalError
from msa_eval.runner.manifest import RECORDS, read_manifest
from msa_eval.runner.records import SampleRecord, scan_records


@dataclass
class LoadedRun:
    run_dir: Path
    manifest: dict[str, Any]
    records: list[SampleRecord]
    unreadable: int = 0  # lines of records.jsonl that are no record (left in place)

    def warning(self) -> str | None:
        if not self.unreadable:
            return None
        n = self.unreadable
        return (f"{self.run_dir / RECORDS}: skipped {n} unreadable line{'s' * (n > 1)} (left as they are; "
                "rerun the `msa-eval run` command of this run to repair and redo them)")


def load_run(run_dir: Path) -> LoadedRun:
    m = read_manifest(run_dir)
    if m is None:
        raise MsaEvalError(f"{run_dir} is not an msa-eval run directory (no manifest.json): "
                           "pass the folder printed by `msa-eval run`")
    scan = scan_records(run_dir / RECORDS)
    latest: dict[tuple[str, str], SampleRecord] = {}
    for r in scan.records:
        latest[(r.backend, r.sample_id)] = r
    return LoadedRun(run_dir, m, list(latest.values()), scan.unreadable)


def load_run_with_records(run_dir: Path) -> LoadedRun:
    """`load_run`, refusing a run without records: one line naming the fix (and why lines were skipped)."""
    run = load_run(run_dir)
    if not run.records:
        warning = run.warning()
        why = f" ({warning})" if warning else ""
        raise MsaEvalError(f"no records in {run_dir}: run `msa-eval run` first, or pass another run{why}")
    return run


def load_runs(run_dirs: list[Path], warn: Callable[[str], None] | None = None) -> list[SampleRecord]:
    """Records of all runs; a backend key seen in two runs gets the run's folder name
    appended (`local:dense#run2`) so the columns stay apart. `warn` gets one line per run
    with unreadable record lines."""
    out: list[SampleRecord] = []
    seen: dict[str, Path] = {}
    for d in run_dirs:
        run = load_run(Path(d))
        if warn is not None and (warning := run.warning()):
            warn(warning)
        rename: dict[str, str] = {}
        for key in sorted({r.backend for r in run.records}):
            if key in seen and seen[key] != run.run_dir:
                rename[key] = f"{key}#{run.run_dir.name}"
            else:
                seen[key] = run.run_dir
        rss = {k: v.get("peak_rss_bytes") for k, v in run.manifest.get("backends", {}).items()}
        for r in run.records:
            update: dict = {}
            if r.peak_mem_bytes is None and rss.get(r.backend):
                update["peak_mem_bytes"] = rss[r.backend]  # process peak RSS when the backend gives none
            if r.backend in rename:
                update["backend"] = rename[r.backend]
            out.append(r.model_copy(update=update) if update else r)
    return out
