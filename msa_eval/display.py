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
