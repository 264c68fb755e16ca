"""repo_regression: the single-prompt form of family `regression` (regression repair).

One family-A task per sample (a seeded AST bug in a real stdlib module, validated: gold
scores 1, untouched scores 0). The prompt holds the failing tests' first traceback, the buggy
module (whole, or an excerpt around the buggy function when it would not fit half the
budget) at the sample's depth among real-source distractor chunks, fitted to T tokens. The
model answers with SEARCH/REPLACE blocks; the edit is applied to the module and graded by the
same verifier as the agent form (fail-to-pass and pass-to-pass tests, tests restored).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import depth_for, finish, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.repo.context import distractors, excerpt, place

MODULES = ("colorsys", "fractions", "shlex", "string", "getopt", "quopri")
_BLOCK = re.compile(r"<{5,9} ?SEARCH\n(.*?)\n?={5,9}\n(.*?)\n?>{5,9} ?REPLACE", re.S)


@lru_cache(maxsize=64)
def agent_task(seed: int, module: str):
    from agents.families.regression import RegressionRepair

    tasks = RegressionRepair().generate(seed, 1, modules=[module])
    if not tasks:
        from tasks.base import TaskError

        raise TaskError(f"no valid regression for module {module} at seed {seed}; use another seed")
    return tasks[0]


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
        from agents.families.common import materialize

        rng, seed = rng_for(self, spec, index)
        module = self.modules[index % len(self.modules)]
        task = agent_task(spec.seed + index, module)
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
                 + first_failure_text(task) + f"\n\nFix the bug in {path}. Answer with one edit in exactly this format:\n"
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
        from agents.families.common import materialize
        from agents.families.regression import grade_on_fresh_copy
        from agents.sandbox import Workspace

        edits = parse_edits(output or "")
        if not edits:
            return failed_score(self.metric)
        task = agent_task(sample.metadata["agent_seed"], sample.metadata["module"])
        path = sample.metadata["path"]
        files = materialize(task.spec)
        text = files[path]
        for old, new in edits:
            if not old or text.count(old) != 1:
                return {"score": 0.0, "metric": self.metric, "parsed": output, "extraction_failed": False,
                        "edit_applied": 0.0}
            text = text.replace(old, new, 1)
        with Workspace(files) as ws:  # baseline = the buggy repo, so the diff is the model's edit
            (ws.root / path).write_text(text, encoding="utf-8")
            g = grade_on_fresh_copy(task, ws)
        return {"score": g.score, "metric": self.metric, "parsed": output, "extraction_failed": False, "edit_applied": 1.0}


def first_failure_text(task) -> str:
    m = re.search(r"First failure:\n(.*)", task.instruction, re.S)
    return m.group(1) if m else ""


@lru_cache(maxsize=1)
def _stdlib_pool() -> dict[str, str]:
    from tasks.repo.needle import _corpus

    return _corpus()[0]
