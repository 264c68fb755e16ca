"""What every runner shares: the `--preset NAME [--json OUT]` command line, the run's environment
row, JSON rows written after every section, and a markdown table of rows."""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from msa_common.atomic import atomic_write_json


def parser(prog: str, doc: str, presets: Mapping[str, Any]) -> argparse.ArgumentParser:
    """`--preset` (choices: `presets`, each listed with the first line of its `doc`) and `--json`."""
    listing = "\n".join(f"  {name:16s} {getattr(p, 'doc', '').splitlines()[0] if getattr(p, 'doc', '') else ''}"
                        for name, p in presets.items())
    ap = argparse.ArgumentParser(prog=prog, description=doc, epilog=f"presets:\n{listing}",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", required=True, choices=list(presets), metavar="NAME", help="what to run (below)")
    ap.add_argument("--json", metavar="OUT", help="write the rows to this file as a JSON list, after every "
                    "section (keep it out of git: benchmarks/out/ is ignored)")
    return ap


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             check=False)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() + ("+dirty" if dirty else "")) or None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(*packages: str) -> dict[str, str | None]:
    """Installed versions of `packages` (None where absent), without importing them."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def env_row(preset: str, packages: Sequence[str] = (), **extra: Any) -> dict:
    """The first row of every run: what ran where (versions of torch and `packages`, CPU, GPU, load,
    commit, time)."""
    import torch

    row = {"bench": "env", "preset": preset, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "commit": git_commit(), "python": platform.python_version(), "torch": torch.__version__,
           "cpu": cpu_name(), "cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        row.update(gpu=p.name, sms=p.multi_processor_count, gpu_mem_gib=round(p.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    return {**row, **versions(*packages), **extra}


def run_sections(sections: Sequence[tuple[str, Callable[[], list[dict]]]], rows: list[dict],
                 out: str | None) -> None:
    """Run each (name, section) in turn, appending its rows; a failing section leaves an error row and
    the other sections run; `rows` is written to `out` after every section."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
    for name, section in sections:
        try:
            rows.extend(section())
        except Exception as e:  # noqa: BLE001 - keep the other sections' numbers
            traceback.print_exc()
            rows.append({"bench": "error", "section": name, "error": repr(e)})
        if out:
            atomic_write_json(out, rows, indent=1)


def table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    """A markdown table: one line per row; columns are (header, key, template such as "{:.1f}x");
    a missing value is '-'."""
    out = ["| " + " | ".join(h for h, _, _ in columns) + " |", "|" + " --- |" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(f.format(r[k]) if r.get(k) is not None else "-" for _, k, f in columns) + " |")
    return "\n".join(out)
