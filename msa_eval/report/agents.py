"""Agent batch runs in `msa-eval report`: load `msa-eval run agents` run directories (layout in
agents/RECORDS.md) and build one table: rows = backend (attention, model) x task family, plus an
overall row per backend; columns = success rate, mean steps, mean/max peak context tokens, total
tokens, cost and exit-status counts. Below it, from each record's trajectory (`agent_turns.py`): cost and
context per task and per turn, and a plot of the context curves. Serialised as Markdown, CSV and JSON
like the HELMET report."""
from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from msa_common.atomic import atomic_write_json, atomic_write_text
from msa_eval.errors import MsaEvalError
from msa_eval.report.agent_turns import TASK_FIELDS, TURN_FIELDS, build_turns, plot_context_curves, table_markdown

AGENT_SCHEMA = "msa-eval.agent-run/1"
MAX_MARKDOWN_TURNS = 200  # a longer per-turn table stays in the CSV and JSON files (the Markdown is printed)
FIELDS = ("backend", "attention", "model", "family", "tasks", "success_rate", "mean_steps",
          "mean_peak_context_tokens", "max_peak_context_tokens", "total_tokens", "cost_usd", "statuses")


def is_agent_run(run_dir: Path) -> bool:
    """True when `run_dir/manifest.json` carries the agent-run schema."""
    p = Path(run_dir) / "manifest.json"
    try:
        return json.loads(p.read_text()).get("schema") == AGENT_SCHEMA
    except (OSError, ValueError, AttributeError):
        return False


@dataclass
class AgentReport:
    rows: list[dict[str, Any]]  # one per (backend, family) and one `family == "overall"` per backend
    notes: list[str] = field(default_factory=list)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # one per (backend, task): cost and context totals
    turns: list[dict[str, Any]] = field(default_factory=list)  # one per model call (agent_turns.TURN_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_agent_runs(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """Records of all agent runs, last line per (backend, task_id) wins; each gets `_attention`
    and `_model` from its manifest and `_run_dir`; a backend key seen in two runs gets `#<folder>` appended."""
    out: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for d in map(Path, run_dirs):
        m = json.loads((d / "manifest.json").read_text())
        info = m.get("backend_info") or {}
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        p = d / "records.jsonl"
        for line in (p.read_bytes().split(b"\n") if p.is_file() else []):
            try:
                r = json.loads(line) if line.strip() else None
            except ValueError:  # not JSON or not UTF-8: a torn last line from a killed run, or garbage
                continue
            if isinstance(r, dict) and "task_id" in r:
                latest[(r.get("backend") or m.get("backend", "?"), r["task_id"])] = r
        for (key, _), r in latest.items():
            if key in seen and seen[key] != d:
                key = f"{key}#{d.name}"
            else:
                seen[key] = d
            kind, _, tail = key.partition(":")
            attention = info.get("attention") or (tail.split("#")[0] if kind == "local" else None)
            out.append({**r, "backend": key, "_attention": attention, "_model": info.get("model"), "_run_dir": str(d)})
    return out


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 2) if xs else None


def _cost(rs: list[dict[str, Any]]) -> float | None:
    """Summed cost; None when unknown: a record without cost, or a hosted (openai) backend
    whose provider reported no cost at all (the harness then sums zeros)."""
    costs = [c for r in rs if (c := r.get("cost_usd")) is not None]
    if len(costs) < len(rs):
        return None
    total = sum(costs)
    if total == 0 and any(r["backend"].startswith("openai:") for r in rs):
        return None
    return round(total, 6)


def _row(backend: str, family: str, rs: list[dict[str, Any]]) -> dict[str, Any]:
    peaks = [r["peak_context_tokens"] for r in rs if r.get("peak_context_tokens") is not None]
    return {"backend": backend, "attention": rs[0]["_attention"], "model": rs[0]["_model"],
            "family": family, "tasks": len(rs),
            "success_rate": round(sum(float(r.get("score") or 0.0) for r in rs) / len(rs), 3),
            "mean_steps": _mean([r["steps"] for r in rs if r.get("steps") is not None]),
            "mean_peak_context_tokens": _mean(peaks), "max_peak_context_tokens": max(peaks, default=None),
            "total_tokens": sum((r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0) for r in rs),
            "cost_usd": _cost(rs), "statuses": dict(sorted(Counter(r.get("status", "?") for r in rs).items()))}


def _family(record: dict[str, Any]) -> str:
    """The record's family by name (records written before the names carry the letters A-D)."""
    from agents.families import FAMILIES

    fam = str(record.get("family", "?"))
    return FAMILIES.find(fam) or fam


def build_agent_report(records: list[dict[str, Any]]) -> AgentReport:
    from agents.families import family_names

    order = {f: i for i, f in enumerate(family_names())}
    rows = []
    for b in dict.fromkeys(r["backend"] for r in records):
        rs = [r for r in records if r["backend"] == b]
        for fam in sorted({_family(r) for r in rs}, key=lambda f: (order.get(f, len(order)), f)):
            rows.append(_row(b, fam, [r for r in rs if _family(r) == fam]))
        rows.append(_row(b, "overall", rs))
    notes = [("success rate = mean score (0-1, partial credit in family rename); overall = over all tasks; "
              "tokens = prompt + completion summed over calls; cost empty when unknown")]
    tasks, turns, turn_notes = build_turns(records, _family)
    return AgentReport(rows, notes + turn_notes, tasks, turns)


def _cells(row: dict[str, Any]) -> list[str]:
    out = []
    for f in FIELDS:
        v = row[f]
        if f == "statuses":
            v = " ".join(f"{k}={n}" for k, n in v.items())
        out.append("" if v is None else str(v))
    return out


def agents_markdown(rep: AgentReport) -> str:
    out = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    out += ["| " + " | ".join(_cells(r)) + " |" for r in rep.rows]
    if rep.tasks:
        out += ["", "Cost and context per task:", "", table_markdown(TASK_FIELDS, rep.tasks)]
        if len(rep.turns) <= MAX_MARKDOWN_TURNS:
            out += ["Per turn (one model call):", "", table_markdown(TURN_FIELDS, rep.turns)]
        else:
            out += [f"Per turn: {len(rep.turns)} model calls, in agents_turns.csv and agents.json (`turns`).", ""]
    out += [""] + [f"Note: {n}" for n in rep.notes]
    return "\n".join(out) + "\n"


def agents_csv(rep: AgentReport) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(FIELDS)
    w.writerows(_cells(r) for r in rep.rows)
    return buf.getvalue()


def _rows_csv(fields: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fields, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_agent_report(rep: AgentReport, out_dir: Path, formats: set[str], plots: bool = False) -> dict[str, Path]:
    """Write agents.md / agents.csv (+ agents_tasks.csv, agents_turns.csv) / agents.json (those in `formats`),
    atomically, and with `plots` agents_context.png (context and cumulative tokens per turn)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    if "md" in formats:
        paths["agents_markdown"] = out_dir / "agents.md"
        atomic_write_text(paths["agents_markdown"], agents_markdown(rep))
    if "csv" in formats:
        paths["agents_csv"] = out_dir / "agents.csv"
        atomic_write_text(paths["agents_csv"], agents_csv(rep))
        for key, name, fields, rows in (("agents_tasks_csv", "agents_tasks.csv", TASK_FIELDS, rep.tasks),
                                        ("agents_turns_csv", "agents_turns.csv", TURN_FIELDS, rep.turns)):
            paths[key] = out_dir / name
            atomic_write_text(paths[key], _rows_csv(fields, rows))
    if "json" in formats:
        paths["agents_json"] = out_dir / "agents.json"
        atomic_write_json(paths["agents_json"], rep.to_dict())
    if plots and rep.turns:
        paths["agents_context_plot"] = plot_context_curves(rep.turns, out_dir / "agents_context.png")
    return paths


def require_records(records: list[dict[str, Any]], run_dirs: list[Path]) -> None:
    if not records:
        raise MsaEvalError(f"no agent records in {', '.join(map(str, run_dirs))}: "
                           "run `msa-eval run agents --suite S` first")
