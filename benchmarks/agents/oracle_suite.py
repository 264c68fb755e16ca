"""Generate an agent suite and run the oracle policy on every task; print a markdown table.

Measures, per task: gold tool calls, oracle steps, peak context and full-trajectory tokens
(under the default model's tokenizer when available, else ceil(chars/4)), score, and wall
times of generation (per family entry, validation included) and of the oracle run.

    .venv/bin/python benchmarks/agents/oracle_suite.py --suite default --tokenizer smollm2-135m
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

from agents.config import AgentConfig
from agents.families import get_family
from agents.oracle import OraclePolicy
from agents.run_one import run_task
from agents.suite import load_suite_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="default")
    ap.add_argument("--tokenizer", default="smollm2-135m", help="'' for the chars/4 approximation")
    args = ap.parse_args()
    count = None
    if args.tokenizer:
        from msa_eval.runner.reference import load_reference_tokenizer

        tok, _ = load_reference_tokenizer(args.tokenizer)
        count = lambda text: len(tok.encode(text))  # noqa: E731
    suite = load_suite_config(args.suite)
    rows, gen_rows = [], []
    with tempfile.TemporaryDirectory() as d:
        for code, entries in suite["families"].items():
            for knobs in entries:
                knobs = dict(knobs)
                n = knobs.pop("n", 1)
                t0 = time.perf_counter()
                tasks = get_family(code).generate(suite["seed"], n, **knobs)
                gen_rows.append((code, knobs, len(tasks), time.perf_counter() - t0))
                for t in tasks:
                    t0 = time.perf_counter()
                    r = run_task(t, OraclePolicy(t.gold, count, t.id), AgentConfig(), Path(d) / f"{t.id}.jsonl")
                    rows.append((t.id, len(t.gold), r.steps, r.peak_context_tokens, r.trajectory_tokens,
                                 r.token_counting, r.score, r.status, time.perf_counter() - t0))
    print(f"# oracle on agent suite `{args.suite}`\n")
    print(f"host: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"tokenizer: {args.tokenizer or 'chars/4'}\n")
    print("| family | knobs | tasks | generation + validation s |\n|---|---|---|---|")
    for code, knobs, n, s in gen_rows:
        print(f"| {code} | {knobs} | {n} | {s:.1f} |")
    print("\n| task | gold calls | oracle steps | peak context tok | trajectory tok | counting | score | status | oracle wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(f"{x:.2f}" if isinstance(x, float) and x != 1.0 and x != 0.0 else str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
