"""The run manifest (manifest.json): what produced the records, for audit and resume.

Holds versions, git commit, seeds, the resolved config and its hash, the reference
tokenizer's fingerprint, each backend's description (model hash, attention config, base
URL), status and timings. A run directory belongs to exactly one config hash: opening it
with another config is refused (the default run directory name contains the hash, so a
changed config gets a new directory by itself)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from msa_common.atomic import atomic_write_json
from msa_eval.runner.config import ConfigError, RunConfig

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"


def git_commit(repo: Path | None = None) -> dict[str, Any]:
    root = repo or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip() != ""
        return {"commit": sha or None, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def versions() -> dict[str, Any]:
    from importlib import metadata

    out: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                           "machine": platform.machine(), "cpu_count": os.cpu_count()}
    for pkg in ("msa-eval", "torch", "triton", "tokenizers", "rouge-score", "openai", "lm_eval"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def new_manifest(cfg: RunConfig, reference: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "msa-eval-run", "format": 1,
        "config_hash": cfg.config_hash(), "config": cfg.identity(),
        "seed": cfg.suite.seed, "reference_tokenizer": reference,
        "versions": versions(), "git": git_commit(),
        "status": "running", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backends": {}, "events": [],
    }


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    p = run_dir / MANIFEST
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError:
        raise ConfigError(f"{p} is not valid JSON: remove the run directory or pick another --out") from None


def check_run_dir(run_dir: Path) -> None:
    """Refuse a path that cannot hold this run (a file, a folder of other things); cheap, so the
    CLI calls it before loading anything."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is a file, not a run directory: pick another --out")
    if run_dir.is_dir() and not (run_dir / MANIFEST).exists() and any(run_dir.iterdir()):
        raise ConfigError(f"{run_dir} exists and is not an msa-eval run directory: pick another --out")


def open_run_dir(run_dir: Path, cfg: RunConfig, reference: dict[str, Any]) -> dict[str, Any]:
    """Create or reopen `run_dir` for `cfg`; refuse a directory made by another config."""
    check_run_dir(run_dir)
    old = read_manifest(run_dir)
    if old is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        m = new_manifest(cfg, reference)
        atomic_write_json(run_dir / MANIFEST, m)
        return m
    if old.get("config_hash") != cfg.config_hash():
        raise ConfigError(
            f"{run_dir} holds a run of another config (hash {old.get('config_hash')}, now "
            f"{cfg.config_hash()}): drop --out to get a new run directory or pick another --out")
    event: dict[str, Any] = {"resumed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if "error" in old:  # the last attempt's error stays in the log, not as the run's state
        event["previous_status"], event["previous_error"] = old.get("status"), old.pop("error")
    old["status"] = "running"
    old.setdefault("events", []).append(event)
    atomic_write_json(run_dir / MANIFEST, old)
    return old


def save_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(run_dir / MANIFEST, manifest)
