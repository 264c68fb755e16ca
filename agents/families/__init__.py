"""The four agent task families (A regression repair, B needle-function retrieval,
C cross-file rename, D stateful ledger). `get_family(code)` returns an instance."""
from __future__ import annotations

import importlib

from agents.errors import UnknownTaskError

_FAMILIES = {
    "A": ("agents.families.regression", "RegressionRepair"),
    "B": ("agents.families.needle", "NeedleFunction"),
    "C": ("agents.families.rename", "CrossFileRename"),
    "D": ("agents.families.ledger", "LedgerFamily"),
}


def family_codes() -> list[str]:
    return list(_FAMILIES)


def get_family(code: str):
    code = code.upper()
    if code not in _FAMILIES:
        raise UnknownTaskError(f"unknown task family {code!r}; families are {', '.join(_FAMILIES)}")
    mod, cls = _FAMILIES[code]
    return getattr(importlib.import_module(mod), cls)()
