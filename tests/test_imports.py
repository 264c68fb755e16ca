"""The bare package names can clash with other installed distributions (PyPI has a
`kernels`); each must import from this repository."""
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["msa_eval", "engine", "kernels", "tasks", "agents"])
def test_package_imports_from_this_repo(name):
    mod = importlib.import_module(name)
    path = Path(mod.__file__).resolve()
    assert path.is_relative_to(REPO), f"{name} imported from {path}, not from {REPO}"
    assert path.parent == REPO / name
