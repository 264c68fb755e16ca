"""The bare package names can clash with other installed distributions (PyPI has a
`kernels`); each must import from this repository. Checked in a fresh interpreter started
outside the repository, so neither the working directory nor pytest's path decides."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["msa_eval", "engine", "kernels", "tasks", "agents", "msa_common"]


@pytest.fixture(scope="module")
def import_paths(tmp_path_factory):
    code = ("import importlib, json; print(json.dumps({n: importlib.import_module(n).__file__ "
            f"for n in {PACKAGES!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path_factory.mktemp("elsewhere"),
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    return json.loads(out.stdout)


@pytest.mark.parametrize("name", PACKAGES)
def test_package_imports_from_this_repo(import_paths, name):
    path = Path(import_paths[name]).resolve()
    assert path.parent == REPO / name, f"{name} imported from {path}, not from {REPO / name}"
