"""Imports point downwards only. The layer order, written down once:

    msa_eval (the app)  ->  agents  ->  tasks
    msa_eval            ->  engine  ->  kernels
    every package       ->  msa_common (the bottom: it imports nothing of ours)

Every `.py` of the packages is parsed with `ast`; module-level imports, imports inside
functions and `importlib.import_module("...")` with a literal name all count. A failure
names file:line and the arrow that is not allowed.
"""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OURS = {"msa_eval", "agents", "tasks", "engine", "kernels", "msa_common", "benchmarks", "tests"}
ALLOWED = {  # package -> the packages of ours it may import (itself included)
    "msa_eval": {"msa_eval", "agents", "tasks", "engine", "kernels", "msa_common"},
    "agents": {"agents", "tasks", "msa_common"},
    "tasks": {"tasks", "msa_common"},
    "engine": {"engine", "kernels", "msa_common"},
    "kernels": {"kernels", "msa_common"},
    "msa_common": {"msa_common"},
}


def imported_names(tree: ast.AST):
    """(line, top-level package) of every absolute import in the tree."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            yield node.lineno, node.args[0].value.split(".")[0]


def wrong_arrows() -> list[str]:
    bad = []
    for pkg, allowed in ALLOWED.items():
        for f in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
            for line, name in imported_names(tree):
                if name in OURS and name not in allowed:
                    bad.append(f"{f.relative_to(REPO)}:{line}: {pkg} -> {name}")
    return bad


def test_every_package_is_walked():
    for pkg in ALLOWED:
        assert (REPO / pkg / "__init__.py").is_file(), pkg


def test_imports_point_downwards_only():
    bad = wrong_arrows()
    assert not bad, "imports that point up or sideways (see the layer order in this file):\n" + "\n".join(bad)


def test_the_walker_sees_function_level_and_dynamic_imports():
    tree = ast.parse("import os\nfrom . import x\ndef f():\n    from msa_eval.errors import E\n"
                     "    import importlib\n    importlib.import_module('engine.llm')\n")
    assert list(imported_names(tree)) == [(1, "os"), (4, "msa_eval"), (5, "importlib"), (6, "engine")]
