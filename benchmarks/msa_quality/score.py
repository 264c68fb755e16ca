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


def table(rows: list[dict]) -> tuple[list[str], dict]:
    """Markdown table: per (task, length) cell, n, every setting's accuracy, then per non-dense
    setting its gap to dense and its attention density."""
    acc: dict[tuple, list[float]] = defaultdict(list)
    dens: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        acc[(r["task"], r["length"], r["setting"])].append(ruler_recall(r["output"], r["answers"]))
        if r.get("density") is not None:
            dens[(r["task"], r["length"], r["setting"])].append(r["density"])
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    settings.sort(key=lambda s: s != "dense")
    sparse = [s for s in settings if s != "dense"]
    cells = sorted({(r["task"], r["length"]) for r in rows})
    lines = ["| task | length | n | " + " | ".join(f"{s} acc" for s in settings) + " | "
             + " | ".join(f"{s} - dense" for s in sparse) + " | " + " | ".join(f"{s} density" for s in sparse) + " |",
             "|" + " --- |" * (3 + len(settings) + 2 * len(sparse))]
    summary = {}
    for task, length in cells:
        a = {s: 100 * sum(acc[(task, length, s)]) / len(acc[(task, length, s)]) for s in settings}
        d = {s: sum(dens[(task, length, s)]) / len(dens[(task, length, s)]) if dens[(task, length, s)] else float("nan")
             for s in sparse}
        n = len(acc[(task, length, settings[0])])
        summary[(task, length)] = a
        lines.append(f"| {task} | {length} | {n} | " + " | ".join(f"{a[s]:.1f}" for s in settings) + " | "
                     + " | ".join(f"{a[s] - a['dense']:+.1f}" for s in sparse) + " | "
                     + " | ".join(f"{d[s]:.3f}" for s in sparse) + " |")
    return lines, summary


def paired_lines(rows: list[dict]) -> list[str]:
    """Per cell and non-dense setting, the paired count over the same samples: samples dense scores
    higher on (dense right, MSA wrong) / samples the setting scores higher on (the reverse)."""
    score = {(r["setting"], r["id"]): ruler_recall(r["output"], r["answers"]) for r in rows}
    settings = [s for s in dict.fromkeys(r["setting"] for r in rows) if s != "dense"]
    cells = sorted({(r["task"], r["length"]) for r in rows})
    ids = {c: [r["id"] for r in rows if r["setting"] == "dense" and (r["task"], r["length"]) == c] for c in cells}
    lines = ["| task | length | " + " | ".join(f"{s}: dense better / {s} better" for s in settings) + " |",
             "|" + " --- |" * (2 + len(settings))]
    for c in cells:
        cols = []
        for s in settings:
            pairs = [(score[("dense", i)], score[(s, i)]) for i in ids[c] if (s, i) in score]
            cols.append(f"{sum(d > m for d, m in pairs)} / {sum(m > d for d, m in pairs)}")
        lines.append(f"| {c[0]} | {c[1]} | " + " | ".join(cols) + " |")
    return lines


def best_setting(summary: dict, among: list[str] | None = None) -> str:
    """The setting (of `among`, default: all but dense and B64/k8 ones) with the highest accuracy
    summed over all cells (the first listed wins ties)."""
    names = among or [s for s in next(iter(summary.values())) if s != "dense" and not s.endswith("b64k8")]
    return max(names, key=lambda s: sum(a[s] for a in summary.values()))


def recall_lines(info: dict) -> list[str]:
    if "recall_b128k16" not in info:
        return []
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
    ap.add_argument("--best", nargs="*", help="print only the name of the best of these settings [default: all "
                    "but dense and *b64k8]")
    a = ap.parse_args()
    raw = Path(a.raw)
    rows = [json.loads(x) for x in (raw / "outputs.jsonl").read_text().splitlines() if x.strip()]
    lines, summary = table(rows)
    if a.best is not None:
        print(best_setting(summary, a.best))
        return
    info = json.loads((raw / "info.json").read_text()) if (raw / "info.json").is_file() else {}
    paired = paired_lines(rows) if any(r["setting"] == "dense" for r in rows) else []
    text = "\n".join(lines) + "\n\n" + "\n".join(paired) + "\n\n" + "\n".join(recall_lines(info)) + "\n"
    if a.out:
        tmp = Path(a.out).with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, a.out)
    print(text)


if __name__ == "__main__":
    main()
