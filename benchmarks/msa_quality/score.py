"""Score `needle_eval.py` outputs (RULER recall from `tasks.metrics`) and write the results table.

    python benchmarks/msa_quality/score.py benchmarks/msa_quality/raw --out benchmarks/msa_quality/RESULTS.md
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path

from tasks.metrics import ruler_recall


def load(raw: Path) -> tuple[list[dict], dict]:
    rows = [json.loads(x) for x in (raw / "outputs.jsonl").read_text().splitlines() if x.strip()]
    return rows, json.loads((raw / "info.json").read_text())


def table(rows: list[dict]) -> tuple[list[str], dict]:
    acc: dict[tuple, list[float]] = defaultdict(list)
    dens: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        acc[(r["task"], r["length"], r["setting"])].append(ruler_recall(r["output"], r["answers"]))
        if r.get("density") is not None:
            dens[(r["task"], r["length"], r["setting"])].append(r["density"])
    settings = sorted({r["setting"] for r in rows}, key=["dense", "msa", "msa-b64k8"].index)
    cells = sorted({(r["task"], r["length"]) for r in rows})
    lines = ["| task | length | n | " + " | ".join(f"{s} acc" for s in settings)
             + " | msa - dense | b64k8 - dense | msa density | b64k8 density |",
             "|" + " --- |" * (3 + len(settings) + 4)]
    summary = {}
    for task, length in cells:
        a = {s: 100 * sum(acc[(task, length, s)]) / len(acc[(task, length, s)]) for s in settings}
        d = {s: sum(dens[(task, length, s)]) / len(dens[(task, length, s)]) if dens[(task, length, s)] else None
             for s in settings}
        n = len(acc[(task, length, "dense")])
        summary[(task, length)] = a
        lines.append(f"| {task} | {length} | {n} | " + " | ".join(f"{a[s]:.1f}" for s in settings)
                     + f" | {a['msa'] - a['dense']:+.1f} | {a['msa-b64k8'] - a['dense']:+.1f}"
                     + f" | {d['msa']:.3f} | {d['msa-b64k8']:.3f} |")
    return lines, summary


def recall_lines(info: dict) -> list[str]:
    a, b = info["recall_b128k16"], info["recall_b64k8"]
    out = [f"Prompts: the first {a['prompts']} 8K niah_single samples ({min(a['prompt_tokens'])}-"
           f"{max(a['prompt_tokens'])} tokens), every prompt position, every query head, reference path.", "",
           "| layer | B128/k16 recall | B64/k8 recall |", "| --- | --- | --- |"]
    for k in sorted(a["by_layer"], key=int):
        out.append(f"| {k} | {a['by_layer'][k]:.3f} | {b['by_layer'][k]:.3f} |")
    out.append(f"| **mean** | **{a['mean']:.3f}** | **{b['mean']:.3f}** |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--out")
    a = ap.parse_args()
    rows, info = load(Path(a.raw))
    lines, _ = table(rows)
    text = "\n".join(lines) + "\n\n" + "\n".join(recall_lines(info)) + "\n"
    if a.out:
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, a.out)
    print(text)


if __name__ == "__main__":
    main()
