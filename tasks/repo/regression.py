"""repo_regression: the single-prompt form of family `regression` (regression repair).

One regression per sample: the seeded AST bug in a real stdlib module that the agent family
finds for the same seed and module (`tasks/repo/bugs.py`), validated (the fixed repository
passes its fail-to-pass and pass-to-pass tests, the buggy one does not). The prompt holds the
failing tests' first traceback, the buggy module (whole, or an excerpt around the buggy
function when it would not fit half the budget) at the sample's depth among real-source
distractor chunks, fitted to T tokens. The model answers with SEARCH/REPLACE blocks; the edit
is applied to the module and graded by the same tests as the agent form (fail-to-pass and
pass-to-pass, on pristine test files).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, TaskError, failed_score
from tasks.common import depth_for, finish, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.repo.bugs import Bug, first_bug, first_failure, grade_files, hash_seed, regression_spec, stdlib_baseline
from tasks.repo.context import distractors, excerpt, place
from tasks.repo.fixtures import materialize, short_hash

MODULES = ("colorsys", "fractions", "shlex", "string", "getopt", "quopri")
_BLOCK = re.compile(r"<{5,9} ?SEARCH\n(.*?)\n?={5,9}\n(.*?)\n?>{5,9} ?REPLACE", re.S)


@dataclass(frozen=True)
class Case:
    id: str  # the id of the agent family's task for the same seed and module
    spec: dict[str, Any]  # files, setup edit, test modules, F2P, P2P, mutation
    first_failure: str  # the first traceback of the buggy module's tests


@lru_cache(maxsize=64)
def regression_case(seed: int, module: str) -> Case:
    """The regression the agent family generates for `seed` and `[module]` (the same three
    seeded tries), validated here by running the tests on the fixed and the buggy repository."""
    base = stdlib_baseline(module)

    def accept(bug: Bug) -> Case | None:
        setup = bug.setup_edit(base.files[bug.path])
        if setup is None:
            return None
        spec = regression_spec(bug, base, setup)
        if grade_files(base.files, spec).resolved != "FULL" or grade_files(materialize(spec), spec).resolved == "FULL":
            return None
        m = bug.mutation
        return Case(f"regression-{module}-{short_hash(seed, module, m.line, m.after)}", spec, first_failure(bug.output))

    used: set[tuple[str, int, str]] = set()
    for i in range(3):
        case = first_bug(base, module, f"{module}.py", hash_seed(seed, module, i), used, accept)
        if case is not None:
            return case
    raise TaskError(f"no valid regression for module {module} at seed {seed}; use another seed")


def parse_edits(output: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in _BLOCK.findall(output or "")]


class RepoRegression(Task):
    name = "repo_regression"
    category = "repo"
    fidelity = "real-data"
    metric = "resolved"
    max_tokens = 256
    description = "fix a seeded bug in a real stdlib module from a long prompt; graded by its real tests"

    def __init__(self, modules: tuple[str, ...] | list[str] = MODULES):
        self.modules = tuple(modules)

    def build(self, index: int, spec: BuildSpec) -> Sample:
        rng, seed = rng_for(self, spec, index)
        module = self.modules[index % len(self.modules)]
        task = regression_case(spec.seed + index, module)
        files = materialize(task.spec)
        path, line = task.spec["mutation"]["path"], task.spec["mutation"]["line"]
        code = f"# ---- file: {path} ----\n{files[path]}"
        half = (spec.target_length - self.budget(spec)) // 2
        if len(spec.tokenizer.encode(code)) > half:
            code = excerpt(path, files[path], line - 30, line + 30)
        edit = task.spec["setup"][0]
        gold = f"<<<<<<< SEARCH\n{edit['new'].rstrip(chr(10))}\n=======\n{edit['old'].rstrip(chr(10))}\n>>>>>>> REPLACE"
        others = {p: t for p, t in _stdlib_pool().items() if p != path}
        stream = distractors(others, set(), seed)
        depth = depth_for(index)
        before = ("A bug was introduced in the library module below; its tests now fail. Other repository code is "
                  "included for reference.\n\n")
        after = ("\n\nFailing tests:\n" + "\n".join(task.spec["f2p"][:10]) + "\n\nFirst failure:\n"
                 + task.first_failure + f"\n\nFix the bug in {path}. Answer with one edit in exactly this format:\n"
                 "<<<<<<< SEARCH\n<exact lines from the file>\n=======\n<replacement lines>\n>>>>>>> REPLACE")

        def make(n: int, tail: int) -> PromptParts:
            units = list(stream[:n + (1 if tail else 0)])
            if tail:
                units[-1] = cut_to_tokens(units[-1], tail, spec.tokenizer)
            return PromptParts(before, place(units, code, depth), after, "")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=0, n_guess=8, tail_max=2000)
        return finish(self, index, spec, fit, [gold], seed, depth=depth, agent_task=task.id, module=module,
                      agent_seed=spec.seed + index, path=path, op=task.spec["mutation"]["op"])

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        edits = parse_edits(output or "")
        if not edits:
            return failed_score(self.metric)
        task = regression_case(sample.metadata["agent_seed"], sample.metadata["module"])
        path = sample.metadata["path"]
        files = materialize(task.spec)
        text = files[path]
        for old, new in edits:
            if not old or text.count(old) != 1:
                return {"score": 0.0, "metric": self.metric, "parsed": output, "extraction_failed": False,
                        "edit_applied": 0.0}
            text = text.replace(old, new, 1)
        files[path] = text  # only the module changes; the tests are the spec's own
        score = 1.0 if grade_files(files, task.spec).resolved == "FULL" else 0.0
        return {"score": score, "metric": self.metric, "parsed": output, "extraction_failed": False,
                "edit_applied": 1.0}


@lru_cache(maxsize=1)
def _stdlib_pool() -> dict[str, str]:
    from tasks.repo.needle import _corpus

    return _corpus()[0]
