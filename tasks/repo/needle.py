"""repo_needle: the single-prompt form of family `needle` (RepoQA search-needle-function, offline).

Context: chunks of real standard-library source (json, email, http, html, urllib) fitted to
the target length with the reference tokenizer; the needle function, docstring removed, sits
at the sample's depth. The question is the docstring's summary; the answer is the function's
name. Score: exact match of the name (a qualified `Class.name` or `path::Class.name` counts).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from tasks.base import BuildSpec, PromptParts, Sample, Task, failed_score
from tasks.common import depth_for, finish, first_line, rng_for
from tasks.fitting import cut_to_tokens, fit_parts
from tasks.repo.context import distractors, excerpt, place
from tasks.repo.corpus import corpus_files, find_needles, strip_docstring
from tasks.repo.fixtures import materialize


@lru_cache(maxsize=2)
def _corpus() -> tuple[dict[str, str], tuple]:
    files = materialize({"files": corpus_files()})
    return files, tuple(find_needles(files))


class RepoNeedle(Task):
    name = "repo_needle"
    category = "repo"
    fidelity = "real-data"
    metric = "exact_match"
    max_tokens = 32
    description = "name the stdlib function matching a description, inside T tokens of real source"

    def build(self, index: int, spec: BuildSpec) -> Sample:
        files, needles = _corpus()
        rng, seed = rng_for(self, spec, index)
        nd = needles[rng.randrange(len(needles))]
        old, new = strip_docstring(files[nd.path], nd)
        text = files[nd.path].replace(old, new, 1)
        removed = nd.doc_end - nd.doc_start + 1
        needle_unit = excerpt(nd.path, text, nd.start, nd.end - removed)
        stream = distractors(files, {nd.path}, seed)
        depth = depth_for(index)
        before = ("Below is source code from a Python repository. One function in it matches the description "
                  "given after the code.\n\n")
        after = (f"\n\nDescription: {nd.description}\n\nWhich function does this describe? "
                 "Reply with the function's name only.")

        def make(n: int, tail: int) -> PromptParts:
            units = list(stream[:n + (1 if tail else 0)])
            if tail:
                units[-1] = cut_to_tokens(units[-1], tail, spec.tokenizer)
            return PromptParts(before, place(units, needle_unit, depth), after, "Function name:")

        fit = fit_parts(make, spec, self.budget(spec), self.name, n_min=0, n_guess=8, tail_max=2000)
        return finish(self, index, spec, fit, [nd.name], seed, depth=depth, needle=f"{nd.path}::{nd.qualname}",
                      qualname=nd.qualname)

    def score(self, sample: Sample, output: str | None) -> dict[str, Any]:
        if not output or not output.strip():
            return failed_score(self.metric)
        line = first_line(output)
        m = re.search(r"[A-Za-z_][\w./:]*", line.replace("`", ""))
        if m is None:
            return failed_score(self.metric)
        parsed = m.group(0).split("::")[-1].split(".")[-1].split(":")[-1].rstrip("(")
        return {"score": float(parsed == sample.answers[0]), "metric": self.metric, "parsed": parsed,
                "extraction_failed": False}
