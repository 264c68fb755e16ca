"""Family `rename` (C): cross-file rename of a package-internal function or class with K call sites.

Source: the standard library's pure-Python `lib2to3` package and its own test modules.
A candidate identifier is defined once at module level and appears only as a definition, a
plain name, an attribute of a module, or an imported name (never as a parameter, keyword or
local), so a token-level codemod is a provably correct gold solution. The workspace's test
files are already migrated to the new name (the verifier restores them from that migrated
copy). Each edit site is a source line, so K lines across M files cost at least M reads and
K edits: tens to hundreds of tool calls.

Grading: static (every non-test file's code tokens equal the codemodded file's: no old name,
no alias, nothing else changed) and dynamic (every baseline-stable test passes). Score 1
only if both hold; `sites_converted` gives partial credit.
"""
from __future__ import annotations

import ast
import builtins
import io
import keyword
import random
import tokenize
from collections import defaultdict
from typing import Any

from agents.env import Grade, WorkspaceEnvironment
from agents.errors import AgentHarnessError
from agents.families.base import Family, validate
from agents.families.common import code_tokens, open_workspace, workspace_files
from agents.sandbox import Workspace
from agents.task import AgentTask
from agents.testing import summarize_failures
from tasks.repo.fixtures import materialize, short_hash, stable_baseline, unique_context
from tasks.repo.sources import package_files, pin, stdlib_dir
from tasks.repo.unittests import TestReport, passed, run_unittests

PACKAGE = "lib2to3"
TEST_MODULES = ["lib2to3.tests.test_fixers", "lib2to3.tests.test_util", "lib2to3.tests.test_pytree"]
TEST_TIMEOUT_S = 180.0


_RESERVED = set(dir(builtins)) | set(keyword.kwlist)


def is_test(rel: str) -> bool:
    return "/tests/" in rel


def package_repo() -> dict[str, Any]:
    files = {r: p for r, p in package_files(stdlib_dir() / PACKAGE, PACKAGE).items() if "/tests/data/" not in r}
    if not any(is_test(r) for r in files):
        raise AgentHarnessError(f"{PACKAGE} has no tests on this machine; family rename needs them")
    return pin(files)


def rename_tokens(text: str, old: str, new: str) -> tuple[str, list[int]]:
    """(text with every NAME token `old` -> `new`, 1-based lines changed)."""
    lines = text.splitlines(keepends=True)
    hits = [t.start for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type == tokenize.NAME and t.string == old]
    for row, col in sorted(hits, reverse=True):
        ln = lines[row - 1]
        lines[row - 1] = ln[:col] + new + ln[col + len(old):]
    return "".join(lines), sorted({r for r, _ in hits})


def find_candidates(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{identifier: {"def": rel, "sites": K lines in non-test files, "files": M}} of safe identifiers."""
    defs: dict[str, list[str]] = defaultdict(list)
    trees = {}
    for rel, text in files.items():
        if not rel.endswith(".py"):
            continue
        try:
            trees[rel] = ast.parse(text)
        except SyntaxError:
            continue
        if not is_test(rel):
            for n in trees[rel].body:
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
                    defs[n.name].append(rel)
    unsafe: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.arg, ast.keyword)):
                if node.arg is not None:  # None: the `**mapping` of a call
                    unsafe.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                unsafe.update({node.name, node.asname})
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                unsafe.update(node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                unsafe.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node not in getattr(tree, "body", []):
                unsafe.add(node.name)
    stems = {rel.rsplit("/", 1)[-1][:-3] for rel in files if rel.endswith(".py")}
    out = {}
    for name, where in defs.items():
        if len(where) != 1 or name in unsafe or name.startswith("__") or name in _RESERVED or name in stems:
            continue
        per_file = {rel: rename_tokens(t, name, name + "_x")[1] for rel, t in files.items()
                    if rel.endswith(".py") and not is_test(rel) and name in t}
        per_file = {r: v for r, v in per_file.items() if v}
        out[name] = {"def": where[0], "sites": sum(map(len, per_file.values())), "files": len(per_file)}
    return out


class CrossFileRename(Family):
    name, version = "rename", "1"
    description = "rename a lib2to3 function/class at K call sites across M files; static + test verified"

    def generate(self, seed: int, n: int, k_min: int = 5, k_max: int = 40,
                 max_steps: int | None = None) -> list[AgentTask]:
        pinned = package_repo()
        files = materialize({"files": pinned})
        cands = sorted((name, c) for name, c in find_candidates(files).items() if k_min <= c["sites"] <= k_max)
        if not cands:
            raise AgentHarnessError(f"no rename candidate with {k_min}..{k_max} sites in {PACKAGE}; widen the range")
        random.Random(seed).shuffle(cands)
        stable, _ = stable_baseline(files, TEST_MODULES, TEST_TIMEOUT_S)
        tasks: list[AgentTask] = []
        for name, c in cands:
            if len(tasks) == n:
                break
            new = random.Random(f"{seed}|{name}").choice([f"{name}_renamed", f"new_{name}", f"{name}_v2"])
            if any(new in t for t in files.values()):
                continue
            task = self._task(seed, pinned, files, name, new, c, sorted(stable), max_steps)
            if validate(self, task) == {"gold": 1.0, "empty": 0.0}:
                tasks.append(task)
        return tasks

    def _task(self, seed, pinned, files, old, new, cand, stable, max_steps) -> AgentTask:
        gold_files, sites, migrated_tests = {}, {}, {}
        for rel, text in files.items():
            if not rel.endswith(".py") or old not in text:
                continue
            renamed, lines = rename_tokens(text, old, new)
            if not lines:
                continue
            if is_test(rel):
                migrated_tests[rel] = renamed
            else:
                gold_files[rel], sites[rel] = renamed, lines
        setup = [{"path": rel, "old": files[rel], "new": t} for rel, t in migrated_tests.items()]
        with Workspace({**files, **migrated_tests, **gold_files}) as ws:  # tests that see the name itself
            outcomes, _ = run_unittests(ws, TEST_MODULES, TEST_TIMEOUT_S)  # (e.g. a repr) leave P2P
        stable = sorted(set(stable) & passed(outcomes))
        gold: list[dict[str, Any]] = []
        for rel in sorted(sites):
            gold.append({"name": "read_file", "arguments": {"path": rel}})
            cur, target = files[rel], gold_files[rel].splitlines(keepends=True)
            for ln in sites[rel]:
                block = unique_context(cur, ln)
                blines = block.splitlines(keepends=True)
                start = _block_start(cur, block)
                newb = "".join(target[ln - 1] if start + i == ln else b for i, b in enumerate(blines))
                gold.append({"name": "str_replace", "arguments": {"path": rel, "old_str": block, "new_str": newb}})
                cur = cur.replace(block, newb, 1)
        gold += [{"name": "run_tests", "arguments": {}}, {"name": "submit", "arguments": {"answer": ""}}]
        k = sum(map(len, sites.values()))
        spec = {"files": pinned, "setup": setup, "test_modules": TEST_MODULES, "old": old, "new": new,
                "expected_files": sorted(sites), "sites": k, "p2p": stable, "gold": gold,
                "gold_hashes": {r: short_hash(t) for r, t in gold_files.items()}}
        instr = (f"API migration in the `{PACKAGE}` package: rename `{old}` (defined in `{cand['def']}`) to `{new}` "
                 f"everywhere in the library: its definition, every import, every call site and every attribute "
                 f"access, in all modules. Keep no alias or compatibility name, and change nothing else. The tests "
                 f"under {PACKAGE}/tests/ already use the new name; do not edit them. Use search to find the "
                 f"uses, edit them, run the tests, then call submit.")
        limits = {"max_steps": max_steps or max(60, 2 * len(gold))}
        return AgentTask(f"{self.name}-{old}-{short_hash(seed, old, new)}", self.name, self.version, seed, instr, spec,
                         limits, {"K": k, "M": len(sites), "identifier": old, "gold_tool_calls": len(gold)})

    def environment(self, task: AgentTask, container: bool = False) -> WorkspaceEnvironment:
        ws = open_workspace(materialize(task.spec), container)

        def run_tests(selection: str | None) -> str:
            mods = ([m for m in task.spec["test_modules"] if selection is None or selection in m]
                    or task.spec["test_modules"])
            outcomes, res = run_unittests(ws, mods, TEST_TIMEOUT_S)
            return summarize_failures(outcomes, res)

        return WorkspaceEnvironment(ws, run_tests, lambda w, a: grade_rename(task, w), command_timeout_s=60)


def _block_start(text: str, block: str) -> int:
    return text[: text.index(block)].count("\n") + 1


def grade_rename(task: AgentTask, ws: Workspace) -> Grade:
    spec = task.spec
    pristine = materialize({"files": spec["files"]})
    src = [r for r in pristine if r.endswith(".py") and not is_test(r)]
    now = workspace_files(ws, src)
    wrong = []
    old_left = 0
    for rel in src:
        gold_text = (rename_tokens(pristine[rel], spec["old"], spec["new"])[0] if rel in spec["expected_files"]
                     else pristine[rel])
        if code_tokens(now[rel]) != code_tokens(gold_text):
            wrong.append(rel)
        old_left += sum(1 for t in code_tokens(now[rel]) if t == (tokenize.NAME, spec["old"]))
    total_old = sum(sum(1 for t in code_tokens(pristine[r]) if t == (tokenize.NAME, spec["old"])) for r in src)
    details: dict[str, Any] = {"static_ok": not wrong, "files_wrong": wrong[:20],
                               "sites_converted": round(1 - old_left / max(total_old, 1), 4)}
    if wrong:
        return Grade(0.0, details)
    patch = ws.diff(exclude=[f"{PACKAGE}/tests/"])
    with Workspace(materialize(spec)) as fresh:
        fresh.apply(patch)
        outcomes, _ = run_unittests(fresh, spec["test_modules"], TEST_TIMEOUT_S)
    rep = TestReport.of(outcomes, [], spec["p2p"])
    details.update(rep.as_dict())
    return Grade(1.0 if rep.resolved == "FULL" else 0.0, details)
