"""Rows measured through the product's own command, `msa-eval run helmet --backend local`: per-task
scores of a run (read from its report.json) and the main job's wall time, CPU time, peak RSS and
load average before / after (other processes on a shared machine inflate wall time)."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunnerRun:
    """One `msa-eval run helmet --backend local ARGS`; `args` as on the command line."""

    args: tuple[str, ...] = ()
    timed: bool = False  # a main-job row: wall, CPU, RSS, load


def msa_eval() -> list[str]:
    exe = Path(sys.executable).with_name("msa-eval")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "msa_eval"]


def run_helmet(run: RunnerRun) -> list[dict]:
    """Rows: `runner_task` per (task, column) with score and n; `main_job` when timed."""
    out_dir = Path(tempfile.mkdtemp(prefix="msa-quality-"))
    cmd = [*msa_eval(), "run", "helmet", "--backend", "local", *run.args, "--out", str(out_dir / "run")]
    print("running:", " ".join(["msa-eval", *cmd[len(msa_eval()):]]), flush=True)
    load0, before = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"msa-eval run exited with {proc.returncode} (run directory {out_dir})")
    report = json.loads((out_dir / "run" / "report" / "report.json").read_text())
    rows = [{"bench": "runner_task", "args": " ".join(run.args), "task": r["name"], "column": col, "score": v,
             "n": r["n"].get(col)} for r in report["rows"] if r["kind"] == "task" for col, v in r["cells"].items()]
    if run.timed:
        overall = next(r for r in report["rows"] if r["kind"] == "overall")["cells"]
        rows.append({"bench": "main_job", "args": " ".join(run.args), "wall_s": wall,
                     "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                     "peak_rss_mb": after.ru_maxrss / 1024, "load_before": load0, "load_after": os.getloadavg()[0],
                     "overall": overall})
    shutil.rmtree(out_dir, ignore_errors=True)
    for r in rows:
        print(r, flush=True)
    return rows


def markdown(rows: list[dict]) -> list[str]:
    out = []
    tasks = [r for r in rows if r["bench"] == "runner_task"]
    if tasks:
        out += ["| command args | task | column | score | n |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{r['args']}` | {r['task']} | {r['column']} | "
                f"{'-' if r['score'] is None else format(r['score'], '.1f')} | {r['n']} |" for r in tasks]
    for r in (r for r in rows if r["bench"] == "main_job"):
        out += ["", "| wall | CPU (user+sys) | load avg before -> after | peak RSS | overall score (0-100) |",
                "| --- | --- | --- | --- | --- |",
                f"| {r['wall_s']:.0f} s | {r['cpu_s']:.0f} s | {r['load_before']:.2f} -> {r['load_after']:.2f} | "
                f"{r['peak_rss_mb']:.0f} MB | " + ", ".join(f"{k} {v}" for k, v in r["overall"].items()) + " |"]
    return out
