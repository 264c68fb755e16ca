"""The four agent task families, by name: `regression` (repair a seeded regression), `needle`
(find the function a description names), `rename` (cross-file rename), `ledger` (a stateful
ticket API). The letters A-D of older suites, records and task ids are aliases of these names.

`get_family(name)` returns an instance (importing only that family's module);
`family_name(name)` the registered name, `task_family(task_id)` the family a task id names.
"""
from __future__ import annotations

from agents.errors import UnknownTaskError
from msa_common.registry import Registry

FAMILIES = Registry(
    table={
        "regression": "agents.families.regression:RegressionRepair",
        "needle": "agents.families.needle:NeedleFunction",
        "rename": "agents.families.rename:CrossFileRename",
        "ledger": "agents.families.ledger:LedgerFamily",
    },
    aliases={"a": "regression", "b": "needle", "c": "rename", "d": "ledger"},
    normalize=lambda s: s.strip().lower(),
    unknown=lambda asked, names: UnknownTaskError(
        f"unknown task family {asked!r}; families are {', '.join(names)} (or their letters A-D)"),
)

def family_names() -> list[str]:
    return list(FAMILIES.names())


def family_name(name: str) -> str:
    """The registered name of a family name or letter ("C", "rename" -> "rename"); unknown raises."""
    return FAMILIES.resolve(name)


def get_family(name: str):
    return FAMILIES.load(name)()


def task_family(task_id: str) -> str | None:
    """The family a task id "<family>-<source>-<hash>" names (old letter ids too), or None."""
    head = task_id.partition("-")[0]
    return FAMILIES.find(head) if head else None


def canonical_task_id(task_id: str) -> str:
    """A task id with its family prefix spelled by name ("A-shlex-9b5d8b52" -> "regression-shlex-9b5d8b52");
    other ids unchanged. The hash part never depended on the prefix, so old ids map exactly."""
    head, sep, rest = task_id.partition("-")
    fam = FAMILIES.find(head) if sep else None
    return f"{fam}-{rest}" if fam else task_id
