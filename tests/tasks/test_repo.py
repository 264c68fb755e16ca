"""Single-prompt repository tasks (families `regression` and `needle` in long-context form): fitted to the target
length with the real tokenizer, deterministic, the needle at its depth, gold scores 1, empty
and wrong answers 0, and the regression answer graded by the module's real tests."""
from __future__ import annotations

import pytest

from tasks.base import BuildSpec
from tasks.registry import get_task
from tasks.repo.regression import RepoRegression


@pytest.mark.parametrize("length", [4096, 8192])
def test_repo_needle_fits_and_scores(ref_tok, length):
    task = get_task("repo_needle")
    s = task.build(3, BuildSpec(length, ref_tok))
    assert length * 0.97 <= s.metadata["prompt_tokens"] + task.max_tokens <= length
    text = s.messages[-1]["content"]
    name, needle = s.answers[0], s.metadata["needle"]
    assert f"def {name}(" in text
    path = needle.split("::")[0]
    assert f"file: {path}" in text
    pos = text.index(f"def {name}(") / len(text)
    assert abs(pos - s.metadata["depth"]) < 0.2
    assert s.score(name)["score"] == 1.0
    assert s.score(f"`{needle}`")["score"] == 1.0
    assert s.score("")["score"] == 0.0 and s.score("")["extraction_failed"]
    assert s.score("some_other_function")["score"] == 0.0
    again = task.build(3, BuildSpec(length, ref_tok))
    assert again.prompt_hash() == s.prompt_hash()


def test_repo_needle_description_is_not_in_the_context(ref_tok):
    s = get_task("repo_needle").build(0, BuildSpec(4096, ref_tok))
    text = s.messages[-1]["content"]
    desc = text.rsplit("Description: ", 1)[1].split("\n")[0]
    assert text.count(desc[:40]) == 1  # only in the question: the docstring was removed


def test_repo_regression_graded_by_real_tests(ref_tok):
    task = RepoRegression(modules=["colorsys"])
    s = task.build(0, BuildSpec(4096, ref_tok))
    assert 4096 * 0.97 <= s.metadata["prompt_tokens"] + task.max_tokens <= 4096
    assert s.metadata["path"] == "colorsys.py"
    gold = s.answers[0]
    assert s.score(gold)["score"] == 1.0
    assert s.score("")["score"] == 0.0
    search = gold.split("=======")[0]
    noop = search + "=======\n" + search.split("\n", 1)[1] + ">>>>>>> REPLACE"  # replace the bug by itself
    r = s.score(noop)
    assert r["score"] == 0.0 and r["edit_applied"] == 1.0
    assert s.score("<<<<<<< SEARCH\nnot in the file\n=======\nx\n>>>>>>> REPLACE")["edit_applied"] == 0.0
