"""Agent test fixtures: one small generated suite per session (real stdlib sources, validated),
with the suite cache in a temporary directory."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def agent_cache(tmp_path_factory):
    d = tmp_path_factory.mktemp("agent-cache")
    old = os.environ.get("MSA_EVAL_CACHE")
    os.environ["MSA_EVAL_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("MSA_EVAL_CACHE", None)
    else:
        os.environ["MSA_EVAL_CACHE"] = old


@pytest.fixture(scope="session")
def small_tasks(agent_cache):
    """{family: [tasks]}: A (colorsys, 1), B (2), C (1, 5-12 sites), D (2)."""
    from agents.families import get_family

    return {
        "A": get_family("A").generate(0, 1, modules=["colorsys"]),
        "B": get_family("B").generate(0, 2),
        "C": get_family("C").generate(0, 1, k_min=5, k_max=12),
        "D": get_family("D").generate(0, 2, n_min=2, n_max=4),
    }


@pytest.fixture()
def d_task(small_tasks):
    return small_tasks["D"][0]
