"""Build the needle-in-a-haystack samples once (CPU), as JSONL, with the HELMET task generators
(`tasks/helmet/recall_niah.py`: niah_single, niah_mk2), chat mode, depths on the task's 11-point
0-100% grid. The same file then goes to every attention setting (`needle_eval.py`).

    python benchmarks/msa_quality/make_needles.py --n 50 --lengths 4096 8192 --out needles.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--tasks", nargs="+", default=["niah_single", "niah_mk2"])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from engine.loader import load
    from tasks.base import BuildSpec
    from tasks.registry import get_task

    tok = load("smollm2-135m", progress=False).tokenizer
    rows = []
    for name in a.tasks:
        task = get_task(name)
        for length in a.lengths:
            spec = BuildSpec(target_length=length, tokenizer=tok, mode="chat", seed=a.seed)
            for s in task.samples(spec, a.n):
                rows.append({"id": s.id, "task": name, "length": length, "messages": s.messages,
                             "answers": s.answers, "max_tokens": s.max_tokens, "depth": s.metadata.get("depth"),
                             "prompt_tokens": s.metadata.get("prompt_tokens")})
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, a.out)
    print(f"{len(rows)} samples -> {a.out}")


if __name__ == "__main__":
    main()
