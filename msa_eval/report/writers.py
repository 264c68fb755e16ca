"""Report serialisations: Markdown (printed at the end of a run), CSV and JSON; every file
is written atomically."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from msa_common.atomic import atomic_write_json, atomic_write_text
from msa_eval.report.build import Report
from msa_eval.report.latency import FIELDS as LATENCY_FIELDS
from msa_eval.report.latency import latency_markdown
from msa_eval.report.stats import format_p
from msa_eval.report.telemetry import FIELDS as TELEMETRY_FIELDS


def delta_columns(rep: Report) -> list[tuple[str, str, int]]:
    return list(dict.fromkeys((d["a"], d["b"], d["length"]) for d in rep.deltas))


def _delta_label(a: str, b: str, n: int) -> str:
    return f"Δ {a.split(':', 1)[1]}−{b.split(':', 1)[1]} @{n // 1024}k [95% CI]"


def delta_cell(d: dict) -> str:
    """`+2.0 [-4.0, +8.0] p=.62`: the paired Δ, its 95% CI and (task rows) the exact test's p."""
    p = f" {format_p(d['p'])}" if d.get("p") is not None else ""
    return f"{d['delta']:+.1f} [{d['lo']:+.1f}, {d['hi']:+.1f}]{p}"


def table_rows(rep: Report) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the main table as strings (shared by Markdown, CSV, rich)."""
    cols = [Report.col(b, n) for b, n in rep.columns]
    dcols = delta_columns(rep)
    header = ["category", "task"] + cols + [_delta_label(*d) for d in dcols]
    index = {(d["a"], d["b"], d["length"], d["name"]): d for d in rep.deltas}
    rows = []
    for r in rep.rows:
        key = r["name"] if r["kind"] == "task" else (r["category"] or "overall")
        line = [r["category"] if r["kind"] != "overall" else "", r["name"]]
        line += ["" if r["cells"][c] is None else f"{r['cells'][c]:.1f}" for c in cols]
        for a, b, n in dcols:
            d = index.get((a, b, n, key))
            line.append("" if d is None else delta_cell(d))
        rows.append(line)
    return header, rows


EFF_FIELDS = ("column", "samples", "prefill_ms", "decode_tok_s", "latency_s", "peak_mem_mb",
              "attention_density", "null_rate", "error_rate", "truncation_rate",
              "max_tokens_rate", "extraction_failure_rate")


def to_markdown(rep: Report) -> str:
    header, rows = table_rows(rep)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    out += ["", "| " + " | ".join(EFF_FIELDS) + " |", "|" + "---|" * len(EFF_FIELDS)]
    for e in rep.efficiency:
        out.append("| " + " | ".join("" if e[f] is None else str(e[f]) for f in EFF_FIELDS) + " |")
    out += ["", ("Scores are 0-100 (headline metric per task); overall = mean of category means; "
                 "empty or failed outputs score 0. Δ: paired over identical prompts, stratified "
                 "bootstrap 95% CI; p: two-sided exact McNemar test (0/1 scores) or sign test "
                 "(other scores) per task.")]
    out += [f"Note: {n}" for n in rep.notes]
    out += telemetry_markdown(rep)
    out += latency_markdown(rep.latency)
    if rep.judge:
        out += ["", "## Optional judge (not in the headline)", "",
                ("A model's grade (rubric 0-3, shown as 0-100) of the open-ended outputs; it is not "
                 "part of the scores, category means, overall score or deltas above."), "",
                "| " + " | ".join(JUDGE_FIELDS) + " |", "|" + "---|" * len(JUDGE_FIELDS)]
        for j in rep.judge:
            out.append("| " + " | ".join("" if j[f] is None else str(j[f]) for f in JUDGE_FIELDS) + " |")
    return "\n".join(out) + "\n"


JUDGE_FIELDS = ("judge", "task", "column", "mean", "n", "unparsed", "errors")


def telemetry_markdown(rep: Report) -> list[str]:
    """The selection telemetry table (local MSA arms), or nothing when no record has telemetry."""
    if not rep.telemetry:
        return []
    out = ["", "## Selection telemetry (local MSA arms)", "",
           ("What the indexer chose, per arm x task x length, means over samples of the mean over MSA layers "
            "and KV groups (0-1), measured on the last P prompt positions and every decode token (decode run "
            "eagerly: a telemetry run is a quality run, not a speed run). recall: share of the oracle's blocks "
            "(top-k by true attention mass) the indexer chose; far_recall: the same over the oracle's far blocks "
            "(not the context's first block, not the one before the query's own: where a needle lies); "
            "mass_recall: dense attention mass inside the "
            "indexer's blocks / inside the oracle's; keys_read: keys read / keys dense attention reads; "
            "local_share: dense mass on the query's own block; layer_overlap: blocks shared with the next MSA "
            "layer; decode_overlap: blocks shared by consecutive decode tokens. Per layer: report.json "
            "(telemetry_layers)."), "",
           "| " + " | ".join(TELEMETRY_FIELDS) + " |", "|" + "---|" * len(TELEMETRY_FIELDS)]
    for t in rep.telemetry:
        out.append("| " + " | ".join("" if t[f] is None else str(t[f]) for f in TELEMETRY_FIELDS) + " |")
    return out


def to_csv(rep: Report) -> str:
    header, rows = table_rows(rep)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def efficiency_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(EFF_FIELDS), extrasaction="ignore")
    w.writeheader()
    w.writerows(rep.efficiency)
    return buf.getvalue()


def _rows_csv(fields, rows: list[dict]) -> str:
    """One table of dict rows as CSV text, columns in `fields` order."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields))
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_report(rep: Report, out_dir: Path, formats: set[str] | None = None) -> dict[str, Path]:
    """Write report.md / report.csv + efficiency.csv (+ judge.csv, telemetry.csv, latency.csv) / report.json
    (those in `formats`)."""
    formats = formats or {"md", "csv", "json"}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if "md" in formats:
        paths["markdown"] = out_dir / "report.md"
        atomic_write_text(paths["markdown"], to_markdown(rep))
    if "csv" in formats:
        paths["csv"], paths["efficiency_csv"] = out_dir / "report.csv", out_dir / "efficiency.csv"
        atomic_write_text(paths["csv"], to_csv(rep))
        atomic_write_text(paths["efficiency_csv"], efficiency_csv(rep))
        if rep.judge:
            paths["judge_csv"] = out_dir / "judge.csv"
            atomic_write_text(paths["judge_csv"], _rows_csv(JUDGE_FIELDS, rep.judge))
        if rep.latency:
            paths["latency_csv"] = out_dir / "latency.csv"
            atomic_write_text(paths["latency_csv"], _rows_csv(LATENCY_FIELDS, rep.latency))
        if rep.telemetry:
            paths["telemetry_csv"] = out_dir / "telemetry.csv"
            atomic_write_text(paths["telemetry_csv"], _rows_csv(TELEMETRY_FIELDS, rep.telemetry))
    if "json" in formats:
        paths["json"] = out_dir / "report.json"
        atomic_write_json(paths["json"], rep.to_dict())
    return paths
