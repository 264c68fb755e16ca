"""Repository fixtures shared by the single-prompt repository tasks and the agent families:
materialise a task's repository from its spec, profile a test baseline (run twice, flaky
tests dropped), build unique-context edits, and the short content hash used in task ids."""
from __future__ import annotations

import ast
import hashlib
from typing import Any

from msa_common.errors import EnvironmentFailure, HarnessError
from tasks.repo.sources import load_pinned
from tasks.repo.unittests import run_unittests
from tasks.repo.workdir import WorkDir


def apply_edits(files: dict[str, str], edits: list[dict[str, str]]) -> dict[str, str]:
    """Apply [{"path", "old", "new"}] edits (each `old` must occur exactly once)."""
    out = dict(files)
    for e in edits:
        text = out[e["path"]]
        if text.count(e["old"]) != 1:
            raise HarnessError(f"setup edit for {e['path']} does not match its source; regenerate the suite")
        out[e["path"]] = text.replace(e["old"], e["new"], 1)
    return out


def materialize(spec: dict[str, Any]) -> dict[str, str]:
    """The task repository: pinned source files + extra files + setup edits."""
    files = load_pinned(spec["files"])
    files.update(spec.get("extra_files", {}))
    return apply_edits(files, spec.get("setup", []))


def stable_baseline(files: dict[str, str], modules: list[str], timeout_s: float) -> tuple[set[str], set[str]]:
    """(tests passing in both of two baseline runs, flaky tests). Raises if nothing passes."""
    with WorkDir(files) as ws:
        a, r1 = run_unittests(ws, modules, timeout_s)
        b, _ = run_unittests(ws, modules, timeout_s)
    ok_a = {t for t, o in a.items() if o == "pass"}
    ok_b = {t for t, o in b.items() if o == "pass"}
    flaky = {t for t in set(a) | set(b) if a.get(t) != b.get(t)}
    if not ok_a & ok_b:
        raise EnvironmentFailure(f"baseline tests of {modules} do not pass here: {r1.output[-300:]}")
    return ok_a & ok_b, flaky


def unique_context(text: str, line_no: int, min_lines: int = 1) -> str:
    """The smallest block of whole lines around 1-based `line_no` that occurs once in `text`."""
    lines = text.splitlines(keepends=True)
    lo = hi = line_no - 1
    while True:
        block = "".join(lines[lo:hi + 1])
        if hi - lo + 1 >= min_lines and text.count(block) == 1:
            return block
        if lo == 0 and hi == len(lines) - 1:
            return text
        lo, hi = max(lo - 1, 0), min(hi + 1, len(lines) - 1)


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except SyntaxError:
        return False


def short_hash(*parts: Any) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8]
