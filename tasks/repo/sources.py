"""Real code on this machine that repository tasks (single-prompt and agentic) are generated
from, pinned by SHA-256.

The default source is the CPython standard library with its test suite (`Lib/test`); some
distributions strip `test`, in which case `stdlib_dir()` raises naming the fix (install the
python3-test package, or pass a repository path with tests). A user path works too: any
directory of Python code with `test_*.py` files.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

from msa_common.errors import HarnessError
from msa_common.files import sha256_file


class RepoWithoutTestsError(HarnessError):
    """A source repository with no test files, so nothing can verify a solution."""


def stdlib_dir() -> Path:
    d = Path(sysconfig.get_paths()["stdlib"])
    if not (d / "test" / "support" / "__init__.py").is_file():
        raise HarnessError(f"the standard library test suite is missing under {d}/test; "
                                "install your distribution's python3 test package or use --source PATH")
    return d


def pin(files: dict[str, Path]) -> dict[str, dict[str, str]]:
    """{rel: {"path": abs, "sha256": hex}} for a task spec."""
    return {rel: {"path": str(p), "sha256": sha256_file(p)} for rel, p in sorted(files.items())}


def load_pinned(pinned: dict[str, dict[str, str]]) -> dict[str, str]:
    """Read pinned files back; a changed file raises (the task set must be regenerated)."""
    out = {}
    for rel, info in pinned.items():
        p = Path(info["path"])
        data = p.read_bytes() if p.is_file() else b""
        if hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise HarnessError(f"source file {p} changed or vanished since the task was generated; "
                                    "regenerate the suite (delete its cache or pass --regenerate)")
        out[rel] = data.decode("utf-8")
    return out


def package_files(pkg_dir: Path, prefix: str) -> dict[str, Path]:
    """Every .py (and grammar .txt) file of a package directory, keyed under `prefix/`."""
    out = {}
    for f in sorted(pkg_dir.rglob("*")):
        if "__pycache__" in f.parts or not f.is_file() or f.suffix not in (".py", ".txt"):
            continue
        out[f"{prefix}/{f.relative_to(pkg_dir).as_posix()}"] = f
    return out


def user_repo(path: Path) -> tuple[dict[str, Path], list[str]]:
    """(files, test modules) of a user directory; no test files -> RepoWithoutTestsError."""
    if not path.is_dir():
        raise HarnessError(f"source path {path} is not a directory; pass a repository root")
    files = {f.relative_to(path).as_posix(): f for f in sorted(path.rglob("*.py"))
             if "__pycache__" not in f.parts and not any(p.startswith(".") for p in f.relative_to(path).parts)}
    tests = [r for r in files if Path(r).name.startswith("test_")]
    if not tests:
        raise RepoWithoutTestsError(f"{path} has no test_*.py files, so no solution can be verified; "
                                    "add tests or choose another repository")
    mods = [r[:-3].replace("/", ".") for r in tests]
    return files, mods
