"""Family `regression` (A): regression repair. A seeded AST mutation breaks a real standard-library module;
the agent must make the module's real test suite pass again.

Kept only if the mutated module parses, at least one test that passed in both baseline runs
now fails (fail-to-pass, F2P), no more than `max_f2p` do, and validation holds (gold = the
reverse edit scores 1, the untouched workspace scores 0). Graded on a fresh copy with the
agent's diff applied to non-test files only (tests are restored from pristine): score 1 when
every F2P and every pass-to-pass (P2P) test passes; details report FULL/PARTIAL/NO.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from agents.env import Grade, WorkspaceEnvironment
from agents.errors import AgentHarnessError
from agents.families.base import Family, validate
from agents.families.common import materialize, open_workspace, parses, stable_baseline, unique_context
from agents.families.mutate import candidates, seeded_order
from agents.sandbox import Workspace
from agents.sources import pin, stdlib_dir, user_repo
from agents.task import AgentTask, short_hash
from agents.testing import TestReport, run_unittests, summarize_failures

# Pure-Python stdlib modules with fast, self-contained unittest files; none is imported by the
# unittest runner itself (so a mutation cannot break the harness).
DEFAULT_MODULES = ("fractions", "shlex", "colorsys", "string", "configparser", "getopt", "quopri", "base64")
TEST_TIMEOUT_S = 120.0


def stdlib_repo(module: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """(pinned files, extra files, test modules) of one stdlib module and its test file."""
    lib = stdlib_dir()
    src, test = lib / f"{module}.py", lib / "test" / f"test_{module}.py"
    if not src.is_file() or not test.is_file():
        raise AgentHarnessError(f"stdlib module {module!r} or its test file is missing; pick another module")
    return pin({f"{module}.py": src, f"tests/test_{module}.py": test}), {"tests/__init__.py": ""}, [f"tests.test_{module}"]


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
        baselines: dict[str, tuple] = {}
        for i in range(n * 3):
            if len(tasks) == n:
                break
            module = mods[i % len(mods)]
            if module not in baselines:
                pinned, extra, tmods = stdlib_repo(module)
                files = materialize({"files": pinned, "extra_files": extra})
                baselines[module] = (pinned, extra, tmods, files, *stable_baseline(files, tmods, TEST_TIMEOUT_S))
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
        tasks, used = [], set()
        for i in range(n * 3):
            if len(tasks) == n or not paths:
                break
            path = paths[i % len(paths)]
            base = (pinned, {}, tmods, files, stable, flaky)
            t = self._one(seed, i, path[:-3].replace("/", "."), base, used, hint, max_f2p, max_tries, path, "")
            if t is not None:
                tasks.append(t)
        return tasks

    def _one(self, seed, i, module, base, used, hint, max_f2p, max_tries, path=None, test_dir="tests/") -> AgentTask | None:
        pinned, extra, tmods, files, stable, _flaky = base
        path = path or f"{module}.py"
        with Workspace(files) as ws:
            for m in seeded_order(candidates(files[path]), hash_seed(seed, module, i))[:max_tries]:
                if (module, m.line, m.after) in used:
                    continue
                mutated = files[path].replace(m.before, m.after, 1) if files[path].count(m.before) == 1 else None
                if mutated is None:
                    old = unique_context(files[path], m.line)
                    mutated = files[path].replace(old, old.replace(m.before, m.after, 1), 1)
                if not parses(mutated):
                    continue
                (ws.root / path).write_text(mutated)
                outcomes, res = run_unittests(ws, tmods, TEST_TIMEOUT_S)
                (ws.root / path).write_text(files[path])
                f2p = sorted(t for t in stable if outcomes.get(t) != "pass")
                if not outcomes or not 1 <= len(f2p) <= max_f2p:
                    continue
                p2p = sorted(stable - set(f2p))
                task = self._task(seed, module, path, pinned, extra, tmods, files, mutated, m, f2p, p2p, outcomes, res, hint)
                if task is not None and not test_dir:  # user repo: tests are the test_*.py files
                    task.spec["test_dir"] = None
                    task.spec["test_files"] = sorted(r for r in files if Path(r).name.startswith("test_"))
                if task is not None and validate(self, task) == {"gold": 1.0, "empty": 0.0}:
                    used.add((module, m.line, m.after))
                    return task
        return None

    def _task(self, seed, module, path, pinned, extra, tmods, files, mutated, m, f2p, p2p, outcomes, res, hint):
        bad_block = unique_context(mutated, m.line)
        good_block = bad_block.replace(m.after, m.before, 1)
        if files[path].count(good_block) != 1:
            return None
        setup = [{"path": path, "old": good_block, "new": bad_block}]
        gold = [{"name": "run_tests", "arguments": {}}, {"name": "read_file", "arguments": {"path": path}},
                {"name": "str_replace", "arguments": {"path": path, "old_str": bad_block, "new_str": good_block}},
                {"name": "run_tests", "arguments": {}}, {"name": "submit", "arguments": {"answer": ""}}]
        spec = {"files": pinned, "extra_files": extra, "setup": setup, "test_modules": tmods, "test_dir": "tests/",
                "f2p": f2p, "p2p": p2p, "gold": gold,
                "mutation": {"op": m.op, "path": path, "line": m.line, "function": m.function}}
        tid = f"{self.name}-{module}-{short_hash(seed, module, m.line, m.after)}"
        return AgentTask(tid, self.name, self.version, seed, instruction(hint, f2p, res.output, m.op, m.function, path),
                         spec, {"max_steps": 30}, {"module": module, "op": m.op, "f2p": len(f2p), "p2p": len(p2p), "hint": hint})

    def environment(self, task: AgentTask, container: bool = False) -> WorkspaceEnvironment:
        ws = open_workspace(materialize(task.spec), container)
        spec = task.spec

        def run_tests(selection: str | None) -> str:
            mods = [mm for mm in spec["test_modules"] if selection is None or mm.startswith(selection) or selection.startswith(mm)]
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


def first_failure(output: str, limit: int = 1500) -> str:
    """The first traceback block of a unittest run, with addresses and timings removed."""
    m = re.search(r"^(?:FAIL|ERROR): .*?(?=^=====|^-{20,}\nRan |\Z)", output, re.S | re.M)
    text = m.group(0) if m else output[:limit]
    text = re.sub(r"0x[0-9a-fA-F]+", "0x...", text)
    text = re.sub(r'File "[^"]*/(repo/)?', 'File "', text)
    return text.strip()[:limit]


def hash_seed(*parts: Any) -> int:
    return int(short_hash(*parts), 16)
