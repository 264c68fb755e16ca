"""Agent test fixtures: one small generated suite per session (real stdlib sources, validated),
an MSA_EVAL_HOME of its own for the suite cache (library calls get its agent-suites folder
passed in; CLI subprocesses get the variable); counts the fuzz tests fill, printed in the summary."""
from __future__ import annotations

from collections import Counter

import pytest

FUZZ_COUNTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def agent_home(tmp_path_factory):
    """An MSA_EVAL_HOME for agent suites (no models live here: the agent tests use the oracle)."""
    return tmp_path_factory.mktemp("agent-home")


@pytest.fixture(scope="session")
def agent_cache(agent_home):
    """The suite cache folder the CLI derives from `agent_home`."""
    return agent_home / "agent-suites"


@pytest.fixture(scope="session")
def small_tasks():
    """{family: [tasks]}: regression (colorsys, 1), needle (2), rename (1, 5-12 sites), ledger (2)."""
    from agents.families import get_family

    return {
        "regression": get_family("regression").generate(0, 1, modules=["colorsys"]),
        "needle": get_family("needle").generate(0, 2),
        "rename": get_family("rename").generate(0, 1, k_min=5, k_max=12),
        "ledger": get_family("ledger").generate(0, 2, n_min=2, n_max=4),
    }


@pytest.fixture()
def d_task(small_tasks):
    return small_tasks["ledger"][0]


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
