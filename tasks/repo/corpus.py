"""The needle corpus shared by the needle tasks (single-prompt `repo_needle`, agent family
`needle`): real pure-Python standard-library packages, and the functions in them that make
fair needles. A needle has a unique name, a body of 5-60 lines besides its docstring, and a
docstring whose summary (the description given to the model) contains none of the name's
word parts; `strip_docstring` is the edit that removes its docstring.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from tasks.repo.sources import package_files, pin, stdlib_dir

CORPUS = ("json", "email", "http", "html", "urllib")


@dataclass(frozen=True)
class Needle:
    path: str
    qualname: str
    name: str
    description: str
    start: int  # 1-based first line of the function (decorators excluded)
    end: int
    doc_start: int  # docstring lines (whole lines), removed in the agentic form
    doc_end: int


def corpus_files(packages: tuple[str, ...] = CORPUS) -> dict[str, Any]:
    lib = stdlib_dir()
    files: dict[str, Any] = {}
    for p in packages:
        if (lib / p).is_dir():
            files.update({k: v for k, v in package_files(lib / p, p).items() if k.endswith(".py")})
        else:
            files[f"{p}.py"] = lib / f"{p}.py"
    return pin(files)


def _words(name: str) -> set[str]:
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)
    return {w.lower() for w in parts if len(w) >= 4}


def summary(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def find_needles(files: dict[str, str]) -> list[Needle]:
    found: list[Needle] = []
    counts: dict[str, int] = {}
    for rel, text in sorted(files.items()):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node, qual in _defs(tree):
            counts[node.name] = counts.get(node.name, 0) + 1
            doc = ast.get_docstring(node)
            if not doc or len(node.body) < 2:
                continue
            d = node.body[0]
            desc = summary(doc)
            body_lines = node.end_lineno - d.end_lineno
            whole = (lines[d.lineno - 1][:d.col_offset].strip() == ""
                     and lines[d.end_lineno - 1][d.end_col_offset:].strip() == "")
            if not (5 <= body_lines <= 60 and 6 <= len(desc.split()) <= 80 and whole):
                continue
            if any(w in desc.lower() for w in _words(node.name)) or node.name in desc:
                continue
            found.append(Needle(rel, qual, node.name, desc, node.lineno, node.end_lineno, d.lineno, d.end_lineno))
    return [n for n in found if counts[n.name] == 1]


def _defs(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.name
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield m, f"{node.name}.{m.name}"


def strip_docstring(text: str, n: Needle) -> tuple[str, str]:
    """(old, new) edit deleting the needle's docstring lines (the old block is unique)."""
    lines = text.splitlines(keepends=True)
    old = "".join(lines[n.start - 1:n.doc_end])
    new = "".join(lines[n.start - 1:n.doc_start - 1])
    return old, new
