"""Run a repository's unittest modules and read per-test outcomes back.

`run_unittests` executes `unittest_json.py` in a work directory (timeout, output cap) and
returns {test_id: outcome}; `TestReport` turns F2P/P2P sets into the FULL/PARTIAL/NO grade.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tasks.repo.workdir import CommandResult, WorkDir

RUNNER = Path(__file__).with_name("unittest_json.py")


def run_unittests(ws: WorkDir, modules: list[str], timeout_s: float = 120.0) -> tuple[dict[str, str], CommandResult]:
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
    def of(cls, outcomes: dict[str, str], f2p: list[str], p2p: list[str]) -> TestReport:
        ok = passed(outcomes)
        return cls(len(f2p), sum(t in ok for t in f2p), len(p2p), sum(t in ok for t in p2p))

    def as_dict(self) -> dict:
        return {"resolved": self.resolved, "f2p": f"{self.f2p_passed}/{self.f2p_total}",
                "p2p": f"{self.p2p_passed}/{self.p2p_total}"}
