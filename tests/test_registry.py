"""The one registry idiom (`msa_common.registry`) and the four tables built on it: every entry
imports to what it names, aliases resolve, unknown names raise the table's own one line, and
listing a table imports nothing."""
from __future__ import annotations

import subprocess
import sys

import pytest

from msa_common.home import msa_eval_home
from msa_common.registry import Registry


def _reg(**kw):
    return Registry(table={"json": "json:dumps", "path": "pathlib:Path"},
                    unknown=lambda asked, names: KeyError(f"no {asked!r}; have {', '.join(names)}"), **kw)


def test_resolve_load_aliases_and_unknown():
    r = _reg(aliases={"j": "json"}, normalize=str.lower)
    assert r.names() == ("json", "path")
    assert r.resolve("JSON") == r.resolve("j") == r.resolve("J") == "json"
    import json
    assert r.load("j") is json.dumps and "Path" in r and "nope" not in r and 3 not in r
    with pytest.raises(KeyError, match="no 'nope'; have json, path"):
        r.resolve("nope")
    with pytest.raises(KeyError, match="no 'nope'"):
        r.load("nope")
    assert _reg().find("JSON") is None  # without normalize, spellings are exact


def test_an_alias_must_point_at_a_name():
    with pytest.raises(ValueError, match="point at no registered name"):
        _reg(aliases={"x": "missing"})


def test_every_table_entry_imports_to_what_it_names():
    from agents.families import FAMILIES
    from msa_eval.backends.factory import BACKENDS
    from msa_eval.cli import COMMANDS
    from tasks.registry import TASKS

    for name in FAMILIES.names():
        assert FAMILIES.load(name).name == name
    for name in TASKS.names():
        assert TASKS.load(name).name == name
    for name in COMMANDS.names():
        assert COMMANDS.load(name).name == name
    assert BACKENDS.names() == ("local", "openai") and all(callable(BACKENDS.load(n)) for n in BACKENDS.names())


def test_every_task_class_is_in_the_table():
    """A task class someone forgets to list would be silently missing from `tasks list`."""
    import importlib
    import pkgutil

    import tasks
    from tasks.base import Task
    from tasks.registry import TASKS

    for m in pkgutil.walk_packages(tasks.__path__, "tasks."):
        importlib.import_module(m.name)
    seen, stack = set(), list(Task.__subclasses__())
    while stack:
        c = stack.pop()
        stack += c.__subclasses__()
        if getattr(c, "name", None) and not getattr(c, "__abstractmethods__", None):
            seen.add((c.name, f"{c.__module__}:{c.__qualname__}"))
    assert seen <= set(TASKS.table.items()), seen - set(TASKS.table.items())


def test_listing_the_tables_imports_no_entry():
    code = ("import sys; from agents.families import FAMILIES; from tasks.registry import TASKS; "
            "from msa_eval.backends.factory import BACKENDS; from msa_eval.cli import COMMANDS; "
            "regs = (FAMILIES, TASKS, BACKENDS, COMMANDS); [r.names() for r in regs]; "
            "mods = {v.partition(':')[0] for r in regs for v in r.table.values()} - {'msa_eval.backends.factory'}; "
            "print(sorted(m for m in mods if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_home_is_the_variable_else_the_user_cache_dir(tmp_path):
    assert msa_eval_home({"MSA_EVAL_HOME": str(tmp_path)}) == tmp_path
    tilde = msa_eval_home({"MSA_EVAL_HOME": "~/x"})
    assert tilde.name == "x" and "~" not in str(tilde)
    default = msa_eval_home({})
    assert default.name == "msa-eval" and default == msa_eval_home({"MSA_EVAL_HOME": ""})
