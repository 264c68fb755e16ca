"""All rich rendering of the CLI lives here (house style rule 13)."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# emoji off: `:m:` in a backend key such as `openai:m:` must not become a glyph
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)


def one_line(message: str) -> str:
    """`message` on one line: its lines joined with "; " (an exception text may hold several)."""
    return "; ".join(x.strip() for x in str(message).splitlines() if x.strip())


def _plain(prefix: str, style: str, message: str) -> None:
    """Every error, warning and notice line goes out here: literal text (no rich markup, no
    :emoji: codes, no highlighting), never wrapped, so a path with `[` or a key like
    `openai:m:` prints as written."""
    line = Text(prefix, style=style) if prefix else Text()
    line.append(one_line(message), style="" if prefix else style)
    err_console.print(line, highlight=False, soft_wrap=True, emoji=False, markup=False)


def error_line(message: str) -> None:
    """One red line on stderr; the message names the fix."""
    _plain("error: ", "bold red", message)


def warning_line(message: str) -> None:
    """One yellow line on stderr: something was skipped or repaired, the command went on."""
    _plain("warning: ", "bold yellow", message)


def info(message: str, dim: bool = False) -> None:
    """One line of status on stderr, printed literally."""
    _plain("", "dim" if dim else "", message)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(Text(str(c)))
    for r in rows:
        t.add_row(*[Text("" if v is None else str(v)) for v in r])  # cells are data, not markup
    console.print(t)


def stream_text(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


# --- runner, report and task rendering (msa-eval run / report / tasks) -----------------------
class RunProgress:
    """Rich progress bar per backend; called by the runner as progress(event, **info)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._p = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                           transient=False)
        self._ids: dict[str, Any] = {}

    def __enter__(self) -> RunProgress:
        self._p.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.stop()

    def __call__(self, event: str, **info: Any) -> None:
        if event == "notice":
            warning_line(info["message"])
        elif event == "backend":
            self._ids[info["key"]] = self._p.add_task(info["key"], total=info["total"],
                                                      completed=info["done"])
        elif event == "advance":
            self._p.advance(self._ids[info["key"]], info["n"])


def report_tables(rep: Any) -> None:
    """The side-by-side score table (with Δ columns) and the efficiency table."""
    from msa_eval.report.writers import EFF_FIELDS, table_rows

    header, rows = table_rows(rep)
    t = Table(title="msa-eval: scores (0-100), overall = mean of category means")
    for c in header:
        t.add_column(Text(c), justify="left" if c in ("category", "task") else "right")
    kinds = [r["kind"] for r in rep.rows]
    for kind, r in zip(kinds, rows, strict=True):
        style = "bold" if kind == "overall" else ("cyan" if kind == "category" else None)
        t.add_row(*(Text(str(v)) for v in r), style=style)
    console.print(t)
    e = Table(title="efficiency and failure rates")
    for f in EFF_FIELDS:
        e.add_column(f, justify="right")
    for row in rep.efficiency:
        e.add_row(*[Text("" if row[f] is None else str(row[f])) for f in EFF_FIELDS])
    console.print(e)
    for n in rep.notes:
        info(f"note: {n}", dim=True)
    if getattr(rep, "judge", None):
        judge_table(rep.judge)
    if getattr(rep, "latency", None):  # msa_eval/report/latency.py
        from msa_eval.report.latency import FIELDS as LATENCY_FIELDS

        table("latency and cost per backend x task x length (report.md says what each column is)", LATENCY_FIELDS,
              [["" if r[f] is None else r[f] for f in LATENCY_FIELDS] for r in rep.latency])
    if getattr(rep, "telemetry", None):  # msa_eval/report/telemetry.py
        from msa_eval.report.telemetry import FIELDS

        table("selection telemetry of the MSA arms (0-1; report.md says what each column is)", FIELDS,
              [[r[f] for f in FIELDS] for r in rep.telemetry])


def judge_table(rows: list[dict[str, Any]]) -> None:
    """The optional judge's grades, apart from the headline table."""
    from msa_eval.report.writers import JUDGE_FIELDS

    table("optional judge (0-100, rubric 0-3; NOT in the headline scores)", JUDGE_FIELDS,
          [["" if r[f] is None else r[f] for f in JUDGE_FIELDS] for r in rows])


def dry_run_table(rows: list[dict[str, Any]]) -> None:
    cols = ["task", "category", "length", "samples", "prompt_tokens_min", "prompt_tokens_max",
            "max_tokens", "truncated"]
    table("dry run: prompts fitted with the reference tokenizer (no model loaded)", cols,
          [[r[c] for c in cols] for r in rows])


def task_sample(task: dict[str, Any], sample: dict[str, Any]) -> None:
    from rich.markup import escape

    table(f"task {task['name']}", ["field", "value"], list(task.items()))
    text = sample["prompt"] or "\n".join(f"[{m['role']}] {m['content']}" for m in sample["messages"])
    head, tail = text[:1200], text[-800:] if len(text) > 2000 else ""
    console.print(escape(head) + ("\n[dim]...[/]\n" + escape(tail) if tail else ""), highlight=False)
    meta = {k: v for k, v in sample["metadata"].items() if not isinstance(v, (dict, list)) or len(str(v)) < 200}
    table("sample", ["field", "value"],
          [("id", sample["id"]), ("answers", sample["answers"]), ("max_tokens", sample["max_tokens"]),
           ("stop", sample["stop"])] + sorted(meta.items()))


# --- agents (msa-eval agent ..., run agents) --------------------------------------------------
def agent_tasks_table(suite: str, entries: list[dict[str, Any]]) -> None:
    """One line per generated task; an entry not generated yet is one line with its config knobs,
    and each family's one-line description follows the table."""
    def knobs(d: dict[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in d.items())

    lines = []
    for e in entries:
        for r in e["tasks"]:
            lines.append((r["id"], e["family"], e["seed"], "cached", r["gold_tool_calls"], r["max_steps"],
                          knobs(r["knobs"])))
        if not e["tasks"]:
            lines.append((f"({e['n']} to generate)", e["family"], e["seed"], e["cache"], None, None, knobs(e["knobs"])))
    table(f"agent suite {suite}", ["id", "family", "seed", "cache", "gold calls", "max steps", "knobs"], lines)
    for fam, about in dict.fromkeys((e["family"], e["description"]) for e in entries):
        info(f"{fam}: {about}", dim=True)
    waiting = [e for e in entries if not e["tasks"]]
    if waiting:
        info(f"{len(waiting)} of {len(entries)} entries not generated yet: their tasks are generated and "
             "gold-validated when first run, or now with `msa-eval agent list --validate` (minutes)", dim=True)


def agent_result(res: dict[str, Any]) -> None:
    color = "green" if res.get("score", 0) >= 1 else "red"
    console.print(f"[bold]{res['task_id']}[/]: status [bold]{res['status']}[/], score [{color}]{res['score']}[/]"
                  f" | steps {res.get('steps')} tool calls {res.get('tool_calls')}"
                  f" format errors {res.get('format_errors')}"
                  f" | peak context {res.get('peak_context_tokens')} tokens, trajectory {res.get('trajectory_tokens')}"
                  f" ({res.get('token_counting')}) | {res.get('wall_s')} s", highlight=False)
    console.print(f"grade: {json.dumps(res.get('grade'))}", highlight=False, markup=False)
    console.print(f"trajectory: {res.get('trajectory')}", highlight=False, markup=False)


def agent_record_line(rec: dict[str, Any]) -> None:
    err_console.print(f"  {rec['task_id']}: {rec['status']} score={rec.get('score')} steps={rec.get('steps')}",
                      highlight=False, markup=False)


def agent_summary_table(rows: list[dict[str, Any]], ran: int, skipped: int) -> None:
    table(f"agent run: {ran} ran, {skipped} already done", ["task", "status", "score", "steps", "tool calls",
          "peak ctx", "prompt tok", "cost $", "wall s"],
          [(r["task_id"], r["status"], r.get("score"), r.get("steps"), r.get("tool_calls"),
            r.get("peak_context_tokens"), r.get("prompt_tokens"), r.get("cost_usd"), r.get("wall_s")) for r in rows])
    if rows:
        ok = sum(1 for r in rows if (r.get("score") or 0) >= 1)
        console.print(f"success {ok}/{len(rows)}", highlight=False)


def agent_transcript(t: Any, max_chars: int = 1500) -> None:
    """A readable transcript of an agent trajectory (`agents.trajectory.Trajectory`)."""
    from rich.markup import escape as _esc

    h = t.header
    console.print(f"[bold]task {h['task']['id']}[/] (family {h['task']['family']}) backend "
                  f"{_esc(json.dumps(h.get('backend')))} policy {h['config']['context_policy']}", highlight=False)

    def clip(s: Any) -> str:
        s = "" if s is None else str(s)
        return _esc(s if len(s) <= max_chars else s[:max_chars] + f" ...[{len(s) - max_chars} more chars]")

    for m in h["messages"]:
        console.print(f"[cyan]{m['role']}[/]: {clip(m.get('content'))}", highlight=False)
    events: dict[int, list[dict[str, Any]]] = {}
    for e in t.events:
        events.setdefault(e["step"], []).append(e)
    for s in t.steps:
        for e in events.get(s["step"] - 1, []):
            console.print(f"[magenta]-- context policy: {e['kind']} {_esc(json.dumps(e['detail'])[:300])}[/]",
                          highlight=False)
        u = s["usage"]
        console.print(f"[bold]step {s['step']}[/] [dim](context {s['context_tokens']} tok, prompt {u['prompt_tokens']},"
                      f" completion {u['completion_tokens']}, {s['latency_s']} s)[/]", highlight=False)
        for m in s["messages"]:
            if m["role"] == "assistant":
                if m.get("content"):
                    console.print(f"[green]assistant[/]: {clip(m['content'])}", highlight=False)
                for tc in m.get("tool_calls") or []:
                    console.print(f"[green]call[/] {tc['function']['name']}({clip(tc['function']['arguments'])})",
                                  highlight=False)
            else:
                who = "result" if m["role"] == "tool" else m["role"]
                console.print(f"[yellow]{who}[/]: {clip(m.get('content'))}", highlight=False)
    if t.result:
        r = t.result
        console.print(f"[bold]result[/]: {r['status']} score {r['score']} steps {r['steps']} peak context "
                      f"{r['peak_context_tokens']} {_esc(json.dumps(r.get('grade')))}", highlight=False)
    else:
        console.print("[bold yellow]no result yet[/] (the run stopped early; "
                      "`agent run --resume --out FILE` continues it)")


def sparsify_summary(prov: dict[str, Any], out: str) -> None:
    """Per-layer attention-mass recall before/after of a `sparsify` run, then where the adapter is."""
    rows = [(k, f"{v['recall_before']:.3f}", f"{v['recall_after']:.3f}", f"{v['loss_first']:.3f}",
             f"{v['loss_last']:.3f}", v["seconds"]) for k, v in prov["layers"].items()]
    m = prov["msa"]
    table(f"MSA indexer B={m['block_size']} k={m['topk']} d_idx={m['d_idx']} (held-out attention-mass recall)",
          ["layer", "recall before", "recall after", "KL first", "KL last", "s"], rows)
    console.print(f"mean recall {prov['mean_recall_before']:.3f} -> {prov['mean_recall_after']:.3f}; "
                  f"wall {prov['wall_seconds']:.0f} s; adapter in {escape(str(out))}: use "
                  f"--model {escape(prov['base']['model_id'])}+{escape(str(out))} --attention msa", highlight=False)
