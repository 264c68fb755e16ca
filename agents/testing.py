"""Run a workspace's unittest modules and read per-test outcomes back.

`run_unittests` executes `unittest_json.py` in the workspace (timeout, output cap) and returns
{test_id: outcome}; `TestReport` turns F2P/P2P sets into the FULL/PARTIAL/NO grade.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agents.sandbox import CommandResult, Workspace

RUNNER = Path(__file__).with_name("unittest_json.py")


def run_unittests(ws: Workspace, modules: list[str], timeout_s: float = 120.0) -> tuple[dict[str, str], CommandResult]:
    """Per-test outcomes of `modules` run in `ws` ({} when the runner itself died)."""
    with tempfile.TemporaryDirectory(prefix="tests-", dir=ws.scratch) as d:
        out = Path(d) / "outcomes.json"
        res = ws.run([ws.python, "-X", "faulthandler", str(RUNNER), str(out), *modules], timeout_s=timeout_s)
        try:
            outcomes = json.loads(out.read_text())
        except (OSError, ValueError):
            outcomes = {}
    return outcomes, res


def passed(outcomes: dict[str, str]) -> set[str]:
    return {t for t, o in outcomes.items() if o in ("pass", "skip", "xfail")}


@dataclass
class TestReport:
    f2p_total: int
    f2p_passed: int
    p2p_total: int
    p2p_passed: int

    @property
    def resolved(self) -> str:
        if self.f2p_passed == self.f2p_total and self.p2p_passed == self.p2p_total:
            return "FULL"
        return "PARTIAL" if self.f2p_passed > 0 else "NO"

    @classmethod
    def of(cls, outcomes: dict[str, str], f2p: list[str], p2p: list[str]) -> "TestReport":
        ok = passed(outcomes)
        return cls(len(f2p), sum(t in ok for t in f2p), len(p2p), sum(t in ok for t in p2p))

    def as_dict(self) -> dict:
        return {"resolved": self.resolved, "f2p": f"{self.f2p_passed}/{self.f2p_total}",
                "p2p": f"{self.p2p_passed}/{self.p2p_total}"}


def summarize_failures(outcomes: dict[str, str], res: CommandResult, limit_chars: int = 6000) -> str:
    """The observation text of a test run: counts, failing ids, trimmed runner output."""
    bad = sorted(t for t, o in outcomes.items() if o in ("fail", "error"))
    lines = [f"{len(outcomes)} tests, {len(bad)} failing"]
    if not outcomes:
        lines = ["the test runner produced no results (import error, timeout or crash)"]
    lines += [f"FAILED {t}" for t in bad[:50]]
    body = res.output if len(res.output) <= limit_chars else res.output[:limit_chars // 2] + "\n...\n" + res.output[-limit_chars // 2:]
    if bad or not outcomes:
        lines += ["", body.strip()]
    if res.timed_out:
        lines.append("[test run timed out]")
    return "\n".join(lines)
