"""Agent test fixtures: one small generated suite per session (real stdlib sources, validated),
with the suite cache in a temporary directory; counts the fuzz tests fill, printed in the summary."""
from __future__ import annotations

import os
from collections import Counter

import pytest

FUZZ_COUNTS = pytest.StashKey[dict]()


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


@pytest.fixture()
def fuzz_counts(request) -> Counter:
    """A Counter the calling fuzz test fills (examples, calls, tool errors, other exceptions);
    printed in the terminal summary, so CI logs show what was tried without -s."""
    table = request.config.stash.setdefault(FUZZ_COUNTS, {})
    return table.setdefault(request.node.name, Counter())


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    table = config.stash.get(FUZZ_COUNTS, {})
    if table:
        terminalreporter.write_sep("-", "agent tool fuzz counts")
        for name, counts in table.items():
            terminalreporter.write_line(f"{name}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
