"""Every family: deterministic under a seed, the oracle solves every generated task through the
real loop (score 1), an empty submission scores 0."""
from __future__ import annotations

import pytest

from agents.config import AgentConfig
from agents.families import get_family
from agents.oracle import OraclePolicy
from agents.run_one import run_task


@pytest.mark.parametrize("family,letter,knobs", [("regression", "A", {"modules": ["colorsys"]}), ("needle", "B", {}),
                                                  ("rename", "C", {"k_min": 5, "k_max": 12}),
                                                  ("ledger", "D", {"n_min": 2, "n_max": 4})])
def test_generation_is_deterministic(small_tasks, family, letter, knobs):
    """Tasks carry the family's name in `family` and as their id's prefix; the old letter gives the same family."""
    n = len(small_tasks[family])
    again = get_family(letter).generate(0, n, **knobs)
    assert [t.content_hash() for t in again] == [t.content_hash() for t in small_tasks[family]]
    assert all(t.family == family and t.id.startswith(f"{family}-") and t.gold[-1]["name"] == "submit" for t in again)


def test_another_seed_gives_other_tasks(small_tasks):
    other = get_family("needle").generate(1, 2)
    assert {t.id for t in other} != {t.id for t in small_tasks["needle"]}


@pytest.mark.parametrize("family", ["regression", "needle", "rename", "ledger"])
def test_oracle_scores_one_and_empty_scores_zero(small_tasks, tmp_path, family):
    for task in small_tasks[family]:
        res = run_task(task, "oracle", AgentConfig(), tmp_path / f"{task.id}.jsonl")
        assert res.status == "submitted" and res.score == 1.0, res.grade
        assert res.tool_calls == len(task.gold)
        empty = run_task(task, OraclePolicy([{"name": "submit", "arguments": {"answer": ""}}]), AgentConfig(),
                         tmp_path / f"{task.id}-empty.jsonl")
        assert empty.status == "submitted" and empty.score == 0.0, empty.grade


def test_regression_breaks_a_real_test_and_reports_it(small_tasks):
    t = small_tasks["regression"][0]
    assert t.spec["f2p"] and t.spec["p2p"]
    assert all(x.startswith("tests.test_colorsys.") for x in t.spec["f2p"])
    assert t.spec["f2p"][0] in t.instruction


def test_rename_wrong_partial_rename_scores_zero(small_tasks, tmp_path):
    t = small_tasks["rename"][0]
    half = [a for a in t.gold if a["name"] != "submit"][: len(t.gold) // 2]
    res = run_task(t, OraclePolicy(half + [{"name": "submit", "arguments": {}}]), AgentConfig(), tmp_path / "c.jsonl")
    assert res.score == 0.0 and res.grade["static_ok"] is False
    assert 0.0 < res.grade["sites_converted"] < 1.0
