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


def test_engine_refuses_someone_elses_kernels(tmp_path):
    """Hugging Face's `kernels` (a dependency of transformers >= 5.25) first on the path: the
    engine names the clash and the fix instead of failing later on a missing submodule."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    out = subprocess.run([sys.executable, "-c", "import engine"], cwd=tmp_path, capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "EngineError" in last and "pip uninstall kernels" in last and str(tmp_path / "kernels") in last
