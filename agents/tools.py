"""The workspace tools an agent calls: OpenAI function schemas plus their implementations.

Tools: bash, read_file, write_file, str_replace, search, list_dir, run_tests, submit.
`submit` is handled by the loop (it ends the episode); the rest act on a `Workspace`.
A tool the model misuses raises `ToolError`; the loop returns the message as the result.
The file tools go through `ConfinedFS` (agents/confined.py): bounded reads, atomic writes, no
escape through `..`, symbolic or hard links. `bash` is not confined (see agents/sandbox.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.errors import EnvironmentFailure, ToolError, ToolFormatError
from agents.sandbox import Workspace

MAX_READ_CHARS = 60_000  # of one read_file observation
MAX_SCAN_BYTES = 256 << 20  # read_file reads at most this far to reach its start line
MAX_EDIT_BYTES = 16 << 20  # str_replace edits files up to this size
MAX_SEARCH_HITS = 200
_CODE_ROOT = Path(__file__).resolve().parent.parent  # where `agents` imports from, for the search worker


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
        command = require(a, "command")
        if "\x00" in command:
            raise ToolError("the command contains a NUL byte, which no shell command can hold; remove it")
        _utf8(command, "command")
        return self.ws.run(command, timeout_s=self.timeout).render()

    def _read_file(self, a: dict[str, Any]) -> str:
        rel = require(a, "path")
        start = require(a, "start_line", int) if "start_line" in a else 1
        end = require(a, "end_line", int) if "end_line" in a else None
        out, scanned = bytearray(), 0
        for n, seg in self.ws.fs.lines(rel, 1 << 16):
            if end is not None and n > end:
                break
            scanned += len(seg)
            if n >= start:
                out += seg
                if len(out) > 4 * MAX_READ_CHARS:  # >= MAX_READ_CHARS characters whatever the encoding
                    break
            elif scanned > MAX_SCAN_BYTES:
                raise ToolError(f"line {start} lies beyond the first {MAX_SCAN_BYTES >> 20} MiB of {rel!r}; "
                                "read_file scans no further: use bash (e.g. tail -c, sed -n) on a file this large")
        text = out.decode("utf-8", errors="replace")
        if len(text) > MAX_READ_CHARS:
            text = text[:MAX_READ_CHARS] + f"\n...[truncated at {MAX_READ_CHARS} chars; read a line range]"
        return text

    def _write_file(self, a: dict[str, Any]) -> str:
        rel, content = require(a, "path"), require(a, "content")
        self.ws.fs.write_bytes(rel, _utf8(content, "content"))
        return f"wrote {len(content)} characters to {rel}"

    def _str_replace(self, a: dict[str, Any]) -> str:
        rel = require(a, "path")
        old, new = require(a, "old_str"), require(a, "new_str")
        if not old:
            raise ToolError("old_str must not be empty")
        data = self.ws.fs.read_bytes(rel, MAX_EDIT_BYTES)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ToolError(f"{rel!r} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}); str_replace "
                            "edits UTF-8 text only: use bash (sed, python) for this file") from None
        n = text.count(old)
        if n != 1:
            raise ToolError(f"old_str occurs {n} times in {rel}; it must occur exactly once (add context)")
        self.ws.fs.write_bytes(rel, _utf8(text.replace(old, new, 1), "new_str"))
        return f"edited {rel}"

    def _search(self, a: dict[str, Any]) -> str:
        """Runs `search_worker` in a subprocess killed at the command timeout (see its docstring)."""
        req = {"root": str(self.ws.fs.root), "path": a.get("path") or ".", "pattern": require(a, "pattern"),
               "max_hits": MAX_SEARCH_HITS}
        try:
            r = subprocess.run([sys.executable, "-m", "agents.search_worker"], input=json.dumps(req).encode(),
                               capture_output=True, timeout=self.timeout, cwd=_CODE_ROOT, env=_worker_env())
        except subprocess.TimeoutExpired:
            raise ToolError(f"search did not finish within the {self.timeout:g} s command timeout; simplify the "
                            "pattern (nested quantifiers such as (a+)+ backtrack exponentially) or narrow the path"
                            ) from None
        except OSError as e:
            raise EnvironmentFailure(f"cannot start the search worker: {e}") from e
        err = r.stderr.decode("utf-8", "replace").strip()
        if r.returncode == 3:
            raise ToolError(err)
        if r.returncode != 0:
            raise EnvironmentFailure(f"the search worker failed (exit {r.returncode}): {err[-300:]}")
        return r.stdout.decode("utf-8", "replace").rstrip("\n")

    def _list_dir(self, a: dict[str, Any]) -> str:
        names = [n for n in self.ws.fs.list_dir(a.get("path") or ".") if n != "__pycache__/"]
        return "\n".join(names) if names else "(empty)"

    def _run_tests(self, a: dict[str, Any]) -> str:
        sel = a.get("selection") or None
        if sel is not None and not isinstance(sel, str):
            raise ToolError("argument 'selection' must be a string")
        assert self._tests_fn is not None, "run_tests is listed only when the family gives a test runner"
        return self._tests_fn(sel)


def _utf8(text: str, key: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError(f"argument {key!r} is not valid Unicode (a lone surrogate at index {e.start}); "
                        "resend it as plain UTF-8 text") from None


def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONSTARTUP")}
    return {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8:backslashreplace"}
