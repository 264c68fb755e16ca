"""Family `regression` (A): regression repair. A seeded AST mutation breaks a real standard-library module;
the agent must make the module's real test suite pass again.

Kept only if the mutated module parses, at least one test that passed in both baseline runs
now fails (fail-to-pass, F2P), no more than `max_f2p` do, and validation holds (gold = the
reverse edit scores 1, the untouched workspace scores 0). Graded on a fresh copy with the
agent's diff applied to non-test files only (tests are restored from pristine): score 1 when
every F2P and every pass-to-pass (P2P) test passes; details report FULL/PARTIAL/NO. The bug
search and the spec are shared with the single-prompt form (`tasks/repo/bugs.py`).
"""
from __future__ import annotations

import random
from pathlib import Path

from agents.env import Grade, WorkspaceEnvironment
from agents.families.base import Family, validate
from agents.families.common import open_workspace
from agents.sandbox import Workspace
from agents.task import AgentTask
from agents.testing import summarize_failures
from tasks.repo.bugs import (
    DEFAULT_MODULES,
    TEST_TIMEOUT_S,
    Baseline,
    Bug,
    first_bug,
    first_failure,
    hash_seed,
    regression_spec,
    stdlib_baseline,
)
from tasks.repo.fixtures import materialize, short_hash, stable_baseline
from tasks.repo.sources import pin, user_repo
from tasks.repo.unittests import TestReport, run_unittests


class RegressionRepair(Family):
    name, version = "regression", "1"
    description = "fix a seeded AST bug in a real stdlib module; graded by F2P and P2P tests"

    def generate(self, seed: int, n: int, modules: list[str] | None = None, hint: int = 1,
                 max_f2p: int = 20, max_tries: int = 30, source: str | None = None) -> list[AgentTask]:
        """`source`: a user repository path (its non-test .py files are mutated) instead of the stdlib."""
        if source is not None:
            return self._from_user_repo(seed, n, Path(source), hint, max_f2p, max_tries)
        mods = list(modules or DEFAULT_MODULES)
        random.Random(seed).shuffle(mods)
        tasks: list[AgentTask] = []
        used: set[tuple[str, int, str]] = set()
        baselines: dict[str, Baseline] = {}
        for i in range(n * 3):
            if len(tasks) == n:
                break
            module = mods[i % len(mods)]
            if module not in baselines:
                baselines[module] = stdlib_baseline(module)
            task = self._one(seed, i, module, baselines[module], used, hint, max_f2p, max_tries)
            if task is not None:
                tasks.append(task)
        return tasks

    def _from_user_repo(self, seed, n, root: Path, hint, max_f2p, max_tries) -> list[AgentTask]:
        found, tmods = user_repo(root)
        pinned = pin(found)
        files = materialize({"files": pinned})
        stable, flaky = stable_baseline(files, tmods, TEST_TIMEOUT_S)
        test_files = {r for r in files if Path(r).name.startswith("test_")}
        paths = sorted(r for r in files if r not in test_files)
        random.Random(seed).shuffle(paths)
        tasks: list[AgentTask] = []
        used: set[tuple[str, int, str]] = set()
        for i in range(n * 3):
            if len(tasks) == n or not paths:
                break
            path = paths[i % len(paths)]
            base = Baseline(pinned, {}, tmods, files, stable, flaky)
            t = self._one(seed, i, path[:-3].replace("/", "."), base, used, hint, max_f2p, max_tries, path, "")
            if t is not None:
                tasks.append(t)
        return tasks

    def _one(self, seed, i, module, base: Baseline, used, hint, max_f2p, max_tries, path=None,
             test_dir="tests/") -> AgentTask | None:
        def accept(bug: Bug) -> AgentTask | None:
            task = self._task(seed, bug, base, hint)
            if task is not None and not test_dir:  # user repo: tests are the test_*.py files
                task.spec["test_dir"] = None
                task.spec["test_files"] = sorted(r for r in base.files if Path(r).name.startswith("test_"))
            return task if task is not None and validate(self, task) == {"gold": 1.0, "empty": 0.0} else None

        return first_bug(base, module, path or f"{module}.py", hash_seed(seed, module, i), used, accept,
                         max_f2p, max_tries)

    def _task(self, seed: int, bug: Bug, base: Baseline, hint: int) -> AgentTask | None:
        setup = bug.setup_edit(base.files[bug.path])
        if setup is None:
            return None
        m, path = bug.mutation, bug.path
        gold = [{"name": "run_tests", "arguments": {}}, {"name": "read_file", "arguments": {"path": path}},
                {"name": "str_replace", "arguments": {"path": path, "old_str": setup["new"], "new_str": setup["old"]}},
                {"name": "run_tests", "arguments": {}}, {"name": "submit", "arguments": {"answer": ""}}]
        spec = regression_spec(bug, base, setup, gold=gold)
        tid = f"{self.name}-{bug.module}-{short_hash(seed, bug.module, m.line, m.after)}"
        instr = instruction(hint, bug.f2p, bug.output, m.op, m.function, path)
        return AgentTask(tid, self.name, self.version, seed, instr, spec, {"max_steps": 30},
                         {"module": bug.module, "op": m.op, "f2p": len(bug.f2p), "p2p": len(bug.p2p), "hint": hint})

    def environment(self, task: AgentTask, container: bool = False) -> WorkspaceEnvironment:
        ws = open_workspace(materialize(task.spec), container)
        spec = task.spec

        def run_tests(selection: str | None) -> str:
            mods = [mm for mm in spec["test_modules"]
                    if selection is None or mm.startswith(selection) or selection.startswith(mm)]
            outcomes, res = run_unittests(ws, mods or spec["test_modules"], TEST_TIMEOUT_S)
            return summarize_failures(outcomes, res)

        return WorkspaceEnvironment(ws, run_tests, lambda w, a: grade_on_fresh_copy(task, w), command_timeout_s=60)


def grade_on_fresh_copy(task: AgentTask, ws: Workspace) -> Grade:
    """Apply the agent's non-test diff to a fresh copy (tests pristine), run F2P + P2P."""
    spec = task.spec
    patch = ws.diff(exclude=[spec["test_dir"]] if spec.get("test_dir") else spec.get("test_files", []))
    touched_tests = ws.diff() != patch
    with Workspace(materialize(spec)) as fresh:
        try:
            fresh.apply(patch)
        except Exception as e:  # noqa: BLE001 - an unappliable diff scores 0
            return Grade(0.0, {"resolved": "NO", "error": f"diff does not apply: {e}"})
        outcomes, _ = run_unittests(fresh, spec["test_modules"], TEST_TIMEOUT_S)
    rep = TestReport.of(outcomes, spec["f2p"], spec["p2p"])
    return Grade(1.0 if rep.resolved == "FULL" else 0.0, {**rep.as_dict(), "touched_tests": touched_tests,
                                                           "diff_lines": patch.count("\n")})


def instruction(hint: int, f2p: list[str], output: str, op: str, function: str, path: str) -> str:
    head = ("A regression was introduced in this repository's library code: its test suite now fails. "
            "Fix the library code (do not edit the tests) so that all tests pass. Use the tools to inspect the "
            "code and run the tests, then call submit.\n\n")
    if hint >= 3:
        return head + "The test suite is red; find out why."
    if hint == 2:
        return head + f"Symptom: a wrong {op.replace('-', ' ')} in function `{function}` of `{path}`."
    shown = "\n".join(f"- {t}" for t in f2p[:10]) + (f"\n- ... ({len(f2p) - 10} more)" if len(f2p) > 10 else "")
    return head + f"Failing tests:\n{shown}\n\nFirst failure:\n{first_failure(output)}"
