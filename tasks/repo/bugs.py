"""Seeded regressions in real modules, shared by the single-prompt task `repo_regression` and
the agent family `regression`.

A `Bug` is a seeded AST mutation (`tasks/repo/mutate.py`) of one module that still parses and
turns at least one, and at most `max_f2p`, of the tests that passed in both baseline runs red
(fail-to-pass, F2P); the other stable tests are pass-to-pass (P2P). Its setup edit writes the
bug in (the smallest unique block of lines around it); the reverse edit is the gold fix.
`first_bug` walks the candidates in seeded order and returns the first one the caller's
`accept` validates; `grade_files` runs F2P + P2P on a repository's files.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from msa_common.errors import HarnessError
from tasks.repo.fixtures import materialize, parses, short_hash, stable_baseline, unique_context
from tasks.repo.mutate import Mutation, candidates, seeded_order
from tasks.repo.sources import pin, stdlib_dir
from tasks.repo.unittests import TestReport, run_unittests
from tasks.repo.workdir import WorkDir

# Pure-Python stdlib modules with fast, self-contained unittest files; none is imported by the
# unittest runner itself (so a mutation cannot break the harness).
DEFAULT_MODULES = ("fractions", "shlex", "colorsys", "string", "configparser", "getopt", "quopri", "base64")
TEST_TIMEOUT_S = 120.0
T = TypeVar("T")


@dataclass(frozen=True)
class Baseline:
    """A repository ready to seed: its pinned and extra files, test modules, the materialised
    files, and the tests that passed in both baseline runs (`stable`) or only in one (`flaky`)."""

    pinned: dict[str, Any]
    extra: dict[str, str]
    test_modules: list[str]
    files: dict[str, str]
    stable: set[str]
    flaky: set[str]


def stdlib_repo(module: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(pinned files, extra files, test modules) of one stdlib module and its test file."""
    lib = stdlib_dir()
    src, test = lib / f"{module}.py", lib / "test" / f"test_{module}.py"
    if not src.is_file() or not test.is_file():
        raise HarnessError(f"stdlib module {module!r} or its test file is missing; pick another module")
    pinned = pin({f"{module}.py": src, f"tests/test_{module}.py": test})
    return pinned, {"tests/__init__.py": ""}, [f"tests.test_{module}"]


def stdlib_baseline(module: str) -> Baseline:
    pinned, extra, tmods = stdlib_repo(module)
    files = materialize({"files": pinned, "extra_files": extra})
    return Baseline(pinned, extra, tmods, files, *stable_baseline(files, tmods, TEST_TIMEOUT_S))


@dataclass(frozen=True)
class Bug:
    module: str  # the stdlib module, or a user repository file's dotted name
    path: str
    mutation: Mutation
    mutated: str  # the module's text with the bug
    f2p: list[str]
    p2p: list[str]
    output: str  # the runner's output on the buggy module

    @property
    def key(self) -> tuple[str, int, str]:
        return self.module, self.mutation.line, self.mutation.after

    def setup_edit(self, original: str) -> dict[str, str] | None:
        """The edit that writes the bug into `original`; None when the fixed block is not unique there."""
        bad_block = unique_context(self.mutated, self.mutation.line)
        good_block = bad_block.replace(self.mutation.after, self.mutation.before, 1)
        if original.count(good_block) != 1:
            return None
        return {"path": self.path, "old": good_block, "new": bad_block}


def first_bug(base: Baseline, module: str, path: str, seed: int, used: set[tuple[str, int, str]],
              accept: Callable[[Bug], T | None], max_f2p: int = 20, max_tries: int = 30) -> T | None:
    """What `accept` makes of the first candidate bug of `path` that it accepts (not None), in
    seeded order, skipping the keys in `used` (the accepted key is added); None if none is."""
    files = base.files
    with WorkDir(files) as ws:
        for m in seeded_order(candidates(files[path]), seed)[:max_tries]:
            if (module, m.line, m.after) in used:
                continue
            mutated = files[path].replace(m.before, m.after, 1) if files[path].count(m.before) == 1 else None
            if mutated is None:
                old = unique_context(files[path], m.line)
                mutated = files[path].replace(old, old.replace(m.before, m.after, 1), 1)
            if not parses(mutated):
                continue
            (ws.root / path).write_text(mutated)
            outcomes, res = run_unittests(ws, base.test_modules, TEST_TIMEOUT_S)
            (ws.root / path).write_text(files[path])
            f2p = sorted(t for t in base.stable if outcomes.get(t) != "pass")
            if not outcomes or not 1 <= len(f2p) <= max_f2p:
                continue
            bug = Bug(module, path, m, mutated, f2p, sorted(base.stable - set(f2p)), res.output)
            got = accept(bug)
            if got is not None:
                used.add(bug.key)
                return got
    return None


def regression_spec(bug: Bug, base: Baseline, setup: dict[str, str], **more: Any) -> dict[str, Any]:
    """The task spec both forms grade from (`more`, e.g. the agent's gold actions, goes before
    the mutation's description)."""
    m = bug.mutation
    return {"files": base.pinned, "extra_files": base.extra, "setup": [setup], "test_modules": base.test_modules,
            "test_dir": "tests/", "f2p": bug.f2p, "p2p": bug.p2p, **more,
            "mutation": {"op": m.op, "path": bug.path, "line": m.line, "function": m.function}}


def grade_files(files: dict[str, str], spec: dict[str, Any]) -> TestReport:
    """F2P + P2P of the spec's tests on `files` (a whole repository)."""
    with WorkDir(files) as ws:
        outcomes, _ = run_unittests(ws, spec["test_modules"], TEST_TIMEOUT_S)
    return TestReport.of(outcomes, spec["f2p"], spec["p2p"])


def first_failure(output: str, limit: int = 1500) -> str:
    """The first traceback block of a unittest run, with addresses and timings removed."""
    m = re.search(r"^(?:FAIL|ERROR): .*?(?=^=====|^-{20,}\nRan |\Z)", output, re.S | re.M)
    text = m.group(0) if m else output[:limit]
    text = re.sub(r"0x[0-9a-fA-F]+", "0x...", text)
    text = re.sub(r'File "[^"]*/(repo/)?', 'File "', text)
    return text.strip()[:limit]


def hash_seed(*parts: Any) -> int:
    return int(short_hash(*parts), 16)
