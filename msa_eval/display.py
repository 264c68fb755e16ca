"""All rich rendering of the CLI lives here (house style rule 13)."""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def error_line(message: str) -> None:
    """One red line on stderr; the message names the fix."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)


def info(message: str) -> None:
    err_console.print(message, highlight=False)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(str(c))
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    console.print(t)


def stream_text(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


# --- runner, report and task rendering (msa-eval run / report / tasks) -----------------------
class RunProgress:
    """Rich progress bar per backend; called by the runner as progress(event, **info)."""

    def __init__(self) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self._p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=err_console,
                           transient=False)
        self._ids: dict[str, Any] = {}

    def __enter__(self) -> "RunProgress":
        self._p.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._p.stop()

    def __call__(self, event: str, **info: Any) -> None:
        if event == "backend":
            self._ids[info["key"]] = self._p.add_task(info["key"], total=info["total"],
                                                      completed=info["done"])
        elif event == "advance":
            self._p.advance(self._ids[info["key"]], info["n"])


def report_tables(rep: Any) -> None:
    """The side-by-side score table (with Δ columns) and the efficiency table."""
    from rich.markup import escape

    from msa_eval.report.writers import EFF_FIELDS, table_rows

    header, rows = table_rows(rep)
    t = Table(title="msa-eval: scores (0-100), overall = mean of category means")
    for c in header:
        t.add_column(c, justify="left" if c in ("category", "task") else "right")
    kinds = [r["kind"] for r in rep.rows]
    for kind, r in zip(kinds, rows):
        style = "bold" if kind == "overall" else ("cyan" if kind == "category" else None)
        t.add_row(*r, style=style)
    console.print(t)
    e = Table(title="efficiency and failure rates")
    for f in EFF_FIELDS:
        e.add_column(f, justify="right")
    for row in rep.efficiency:
        e.add_row(*["" if row[f] is None else str(row[f]) for f in EFF_FIELDS])
    console.print(e)
    for n in rep.notes:
        info(f"[dim]note: {escape(n)}[/]")


def dry_run_table(rows: list[dict[str, Any]]) -> None:
    cols = ["task", "category", "length", "samples", "prompt_tokens_min", "prompt_tokens_max",
            "max_tokens", "truncated"]
    table("dry run: prompts fitted with the reference tokenizer (no model loaded)", cols,
          [[r[c] for c in cols] for r in rows])


def task_sample(task: dict[str, Any], sample: dict[str, Any]) -> None:
    from rich.markup import escape

    table(f"task {task['name']}", ["field", "value"], [(k, v) for k, v in task.items()])
    text = sample["prompt"] or "\n".join(f"[{m['role']}] {m['content']}" for m in sample["messages"])
    head, tail = text[:1200], text[-800:] if len(text) > 2000 else ""
    console.print(escape(head) + ("\n[dim]...[/]\n" + escape(tail) if tail else ""), highlight=False)
    meta = {k: v for k, v in sample["metadata"].items() if not isinstance(v, (dict, list)) or len(str(v)) < 200}
    table("sample", ["field", "value"],
          [("id", sample["id"]), ("answers", sample["answers"]), ("max_tokens", sample["max_tokens"]),
           ("stop", sample["stop"])] + sorted(meta.items()))
