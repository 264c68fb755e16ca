"""The workspace tools an agent calls: OpenAI function schemas plus their implementations.

Tools: bash, read_file, write_file, str_replace, search, list_dir, run_tests, submit.
`submit` is handled by the loop (it ends the episode); the rest act on a `Workspace`.
A tool the model misuses raises `ToolError`; the loop returns the message as the result.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from agents.errors import ToolError, ToolFormatError
from agents.sandbox import Workspace

MAX_READ_CHARS = 60_000
MAX_SEARCH_HITS = 200


def spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """One OpenAI-style tool schema."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


_S = {"type": "string"}
_I = {"type": "integer"}

SUBMIT_SPEC = spec("submit", "Finish the task. Pass your final answer (if the task asks for one).",
                   {"answer": {**_S, "description": "final answer; empty for code-editing tasks"}}, [])

WORKSPACE_SPECS = {
    "bash": spec("bash", "Run a bash command in the repository root (timeout applies, output truncated).",
                 {"command": _S}, ["command"]),
    "read_file": spec("read_file", "Read a text file, optionally lines start..end (1-based, inclusive).",
                      {"path": _S, "start_line": _I, "end_line": _I}, ["path"]),
    "write_file": spec("write_file", "Create or overwrite a file with the given content.",
                       {"path": _S, "content": _S}, ["path", "content"]),
    "str_replace": spec("str_replace", "Replace the one occurrence of old_str in a file by new_str.",
                        {"path": _S, "old_str": _S, "new_str": _S}, ["path", "old_str", "new_str"]),
    "search": spec("search", "Search files for a regular expression; prints path:line: text.",
                   {"pattern": _S, "path": {**_S, "description": "file or directory, default '.'"}}, ["pattern"]),
    "list_dir": spec("list_dir", "List a directory (default: repository root).", {"path": _S}, []),
    "run_tests": spec("run_tests", "Run the repository's tests (optionally one test module) and report failures.",
                      {"selection": _S}, []),
}


def require(args: dict[str, Any], key: str, kind: type = str) -> Any:
    if key not in args:
        raise ToolFormatError(f"missing required argument {key!r}")
    v = args[key]
    if kind is int and isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ToolFormatError(f"argument {key!r} must be a {kind.__name__}")
    return v


class WorkspaceTools:
    """Implements the workspace tools on one `Workspace`.

    run_tests: callable(selection or None) -> observation text, supplied by the task family.
    """

    def __init__(self, ws: Workspace, run_tests: Callable[[str | None], str] | None,
                 names: list[str] | None = None, command_timeout_s: float = 60.0):
        self.ws = ws
        self._tests_fn = run_tests
        self.timeout = command_timeout_s
        self.names = names or [n for n in WORKSPACE_SPECS if n != "run_tests" or run_tests is not None]

    def specs(self) -> list[dict[str, Any]]:
        return [WORKSPACE_SPECS[n] for n in self.names] + [SUBMIT_SPEC]

    def call(self, name: str, args: dict[str, Any]) -> str:
        if name not in self.names:
            raise ToolFormatError(f"unknown tool {name!r}; available: {', '.join(self.names + ['submit'])}")
        return getattr(self, f"_{name}")(args)

    def _bash(self, a: dict[str, Any]) -> str:
        return self.ws.run(require(a, "command"), timeout_s=self.timeout).render()

    def _read_file(self, a: dict[str, Any]) -> str:
        p = self.ws.resolve(require(a, "path"))
        if not p.is_file():
            raise ToolError(f"no such file: {a['path']}")
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        start = require(a, "start_line", int) if "start_line" in a else 1
        end = require(a, "end_line", int) if "end_line" in a else len(lines)
        text = "".join(lines[max(start, 1) - 1:max(end, 0)])
        if len(text) > MAX_READ_CHARS:
            text = text[:MAX_READ_CHARS] + f"\n...[truncated at {MAX_READ_CHARS} chars; read a line range]"
        return text

    def _write_file(self, a: dict[str, Any]) -> str:
        p = self.ws.resolve(require(a, "path"))
        content = require(a, "content")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content, encoding="utf-8")
        return f"wrote {len(content)} characters to {a['path']}"

    def _str_replace(self, a: dict[str, Any]) -> str:
        p = self.ws.resolve(require(a, "path"))
        old, new = require(a, "old_str"), require(a, "new_str")
        if not p.is_file():
            raise ToolError(f"no such file: {a['path']}")
        if not old:
            raise ToolError("old_str must not be empty")
        text = p.read_text(encoding="utf-8")
        n = text.count(old)
        if n != 1:
            raise ToolError(f"old_str occurs {n} times in {a['path']}; it must occur exactly once (add context)")
        p.write_text(text.replace(old, new, 1), encoding="utf-8")
        return f"edited {a['path']}"

    def _search(self, a: dict[str, Any]) -> str:
        try:
            rx = re.compile(require(a, "pattern"))
        except re.error as e:
            raise ToolError(f"bad regular expression: {e}") from e
        base = self.ws.resolve(a.get("path") or ".")
        files = [base] if base.is_file() else sorted(f for f in base.rglob("*") if f.is_file())
        hits: list[str] = []
        root = self.ws.root.resolve()
        for f in files:
            if f.suffix in {".pyc", ".pickle"}:
                continue
            try:
                for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                    if rx.search(line):
                        hits.append(f"{f.relative_to(root)}:{i}: {line.strip()[:200]}")
            except (UnicodeDecodeError, OSError):
                continue
            if len(hits) >= MAX_SEARCH_HITS:
                hits.append(f"...[stopped at {MAX_SEARCH_HITS} hits; narrow the pattern or path]")
                break
        return "\n".join(hits) if hits else "no matches"

    def _list_dir(self, a: dict[str, Any]) -> str:
        p = self.ws.resolve(a.get("path") or ".")
        if not p.is_dir():
            raise ToolError(f"not a directory: {a.get('path')}")
        names = sorted((c.name + ("/" if c.is_dir() else "")) for c in p.iterdir() if c.name != "__pycache__")
        return "\n".join(names) if names else "(empty)"

    def _run_tests(self, a: dict[str, Any]) -> str:
        sel = a.get("selection") or None
        if sel is not None and not isinstance(sel, str):
            raise ToolError("argument 'selection' must be a string")
        return self._tests_fn(sel)
