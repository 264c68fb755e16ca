"""The oracle policy on every task of an agent suite, through the real loop and tools.

    python -m benchmarks.agents.run --preset default [--json OUT]

Per family entry of the suite (`configs/agents.yaml`): tasks generated and their generation +
validation wall time. Per task: gold tool calls, oracle steps, peak context and full-trajectory
tokens (under the default model's tokenizer, or ceil(chars / 4) with `tokenizer=None`), score,
status and the oracle run's wall time. One run, not a median (the times are for scale).
Generation is timed here, uncached: the suite cache of `msa-eval agent` is not used.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cli import env_row, parser, run_sections, table


@dataclass(frozen=True)
class Preset:
    doc: str
    suite: str
    tokenizer: str | None = "smollm2-135m"


PRESETS: dict[str, Preset] = {
    "default": Preset("the README's row: the default suite (12 tasks, incl. the 954-call ledger task)", "default"),
    "long": Preset("the two long-horizon tasks only", "long"),
    "ci": Preset("the smoke suite: one short task per family (well under a minute)", "smoke"),
}


def token_counter(tokenizer: str | None):
    if not tokenizer:
        return None
    from engine.loader import load_tokenizer

    tok = load_tokenizer(tokenizer, progress=False).tokenizer
    return lambda text: len(tok.encode(text))


def run(p: Preset) -> list[dict]:
    from agents.config import AgentConfig
    from agents.families import get_family
    from agents.oracle import OraclePolicy
    from agents.run_one import run_task
    from agents.suite import load_suite_config

    count = token_counter(p.tokenizer)
    suite = load_suite_config(p.suite)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as d:
        for family, entries in suite["families"].items():
            for knobs in entries:
                knobs = dict(knobs)
                n = knobs.pop("n", 1)
                t0 = time.perf_counter()
                tasks = get_family(family).generate(suite["seed"], n, **knobs)
                rows.append({"bench": "generate", "family": family, "knobs": str(knobs), "tasks": len(tasks),
                             "wall_s": time.perf_counter() - t0})
                print(rows[-1], flush=True)
                for t in tasks:
                    t0 = time.perf_counter()
                    r = run_task(t, OraclePolicy(t.gold, count, t.id), AgentConfig(), Path(d) / f"{t.id}.jsonl")
                    rows.append({"bench": "oracle", "task": t.id, "gold_calls": len(t.gold), "steps": r.steps,
                                 "peak_context_tokens": r.peak_context_tokens, "trajectory_tokens": r.trajectory_tokens,
                                 "counting": r.token_counting, "score": r.score, "status": r.status,
                                 "wall_s": time.perf_counter() - t0})
                    print(rows[-1], flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    gen = table([r for r in rows if r["bench"] == "generate"],
                [("family", "family", "{}"), ("knobs", "knobs", "{}"), ("tasks", "tasks", "{}"),
                 ("generation + validation s", "wall_s", "{:.1f}")])
    oracle = table([r for r in rows if r["bench"] == "oracle"],
                   [("task", "task", "{}"), ("gold calls", "gold_calls", "{}"), ("oracle steps", "steps", "{}"),
                    ("peak context tok", "peak_context_tokens", "{}"), ("trajectory tok", "trajectory_tokens", "{}"),
                    ("counting", "counting", "{}"), ("score", "score", "{}"), ("status", "status", "{}"),
                    ("oracle wall s", "wall_s", "{:.2f}")])
    errors = [f"error: {r}" for r in rows if r["bench"] == "error"]
    return "\n\n".join([gen, oracle, *errors])


def main(argv: list[str] | None = None) -> None:
    args = parser("python -m benchmarks.agents.run", __doc__, PRESETS).parse_args(argv)
    p = PRESETS[args.preset]
    rows: list[dict] = [env_row(args.preset, suite=p.suite, tokenizer=p.tokenizer or "chars/4")]
    run_sections([("agents", lambda: run(p))], rows, args.json)
    print(markdown(rows))


if __name__ == "__main__":
    main()
