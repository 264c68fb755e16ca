"""Helpers shared by the coding families: open a task's workspace (local or container),
compare code formatting-insensitively, and read files back from a workspace. The repository
fixtures both task forms share (materialise, baseline, edits) are in `tasks/repo/fixtures.py`."""
from __future__ import annotations

import io
import tokenize
from pathlib import Path

from agents.sandbox import Workspace


def open_workspace(files: dict[str, str], container: bool = False) -> Workspace:
    """A local workspace, or a container one when asked for and Docker and its image work."""
    if container:
        from agents.sandbox import ContainerWorkspace, container_available

        if container_available():
            return ContainerWorkspace(files)
    return Workspace(files)


def code_tokens(text: str) -> list[tuple[int, str]]:
    """Token stream without layout and comments (formatting-insensitive comparison)."""
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    try:
        return [(t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in skip]
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [(-1, text)]


def workspace_files(ws: Workspace, rels: list[str]) -> dict[str, str]:
    out = {}
    for rel in rels:
        p = Path(ws.root) / rel
        out[rel] = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""
    return out
