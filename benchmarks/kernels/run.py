"""Kernel benchmarks, one command for every op:

    python -m benchmarks.kernels.run --op prefill --preset headline [--json OUT]

Each op is a module ``benchmarks/kernels/<op>.py`` with ``PRESETS: dict[str, preset]`` (a preset has a
``doc`` line) and ``run(preset: str) -> list[dict]`` (one dict per table row, keys = column names).
This prints the rows as a markdown table and, with ``--json``, writes them with the run's
environment (GPU, versions, commit). Keep the JSON out of git unless a RESULTS table cites it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import subprocess
import time
from pathlib import Path

OPS = ("prefill", "indexer", "decode", "moe")


def environment() -> dict:
    """What ran where: GPU, torch, Triton, Python, commit, date."""
    import torch
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (TRITON_INTERPRET)"
    return dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                commit=commit, date_utc=time.strftime("%Y-%m-%d %H:%M", time.gmtime()))


def markdown(rows: list[dict]) -> str:
    """The rows as one markdown table, columns in order of first appearance, '-' where a row has none."""
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join("-" if r.get(c) is None else str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernels.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", required=True, choices=OPS)
    ap.add_argument("--preset", required=True, metavar="NAME",
                    help="a preset of the op's module (an unknown name lists them)")
    ap.add_argument("--json", metavar="OUT", help="write {op, preset, env, rows} to this file")
    args = ap.parse_args(argv)
    module = importlib.import_module(f"benchmarks.kernels.{args.op}")
    if args.preset not in module.PRESETS:
        names = ", ".join(f"{k} ({getattr(v, 'doc', '')})" for k, v in module.PRESETS.items())
        ap.error(f"--op {args.op} has no preset {args.preset!r}; presets: {names}")
    env = environment()
    print(json.dumps(env), flush=True)
    rows = module.run(args.preset)
    print(markdown(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(op=args.op, preset=args.preset, env=env, rows=rows), indent=1))


if __name__ == "__main__":
    main()
