"""The observation text of a test run, as the agent's `run_tests` tool shows it.

Running the tests and grading F2P/P2P live with the repository fixtures (`tasks/repo/unittests.py`).
"""
from __future__ import annotations

from tasks.repo.workdir import CommandResult


def summarize_failures(outcomes: dict[str, str], res: CommandResult, limit_chars: int = 6000) -> str:
    """The observation text of a test run: counts, failing ids, trimmed runner output."""
    bad = sorted(t for t, o in outcomes.items() if o in ("fail", "error"))
    lines = [f"{len(outcomes)} tests, {len(bad)} failing"]
    if not outcomes:
        lines = ["the test runner produced no results (import error, timeout or crash)"]
    lines += [f"FAILED {t}" for t in bad[:50]]
    out = res.output
    body = out if len(out) <= limit_chars else out[:limit_chars // 2] + "\n...\n" + out[-limit_chars // 2:]
    if bad or not outcomes:
        lines += ["", body.strip()]
    if res.timed_out:
        lines.append("[test run timed out]")
    return "\n".join(lines)
