"""Agent suites: families by name with the letters as aliases, listing without generating, and the
per-entry cache (used when current; a changed source file, a torn or edited cache file is rebuilt)."""
from __future__ import annotations

import json

import pytest
import yaml

from agents.errors import AgentHarnessError, UnknownTaskError
from agents.families import canonical_task_id, family_name, get_family, task_family
from agents.suite import cache_path, entry_status, entry_tasks, find_task, load_suite_config, open_suite, suite_tasks


def _repo(root, body="    return a + b\n"):
    """A tiny user repository whose test breaks under a seeded mutation of `add`."""
    root.mkdir(exist_ok=True)
    (root / "lib.py").write_text("def add(a, b):\n" + body)
    (root / "test_lib.py").write_text("import unittest\n\nfrom lib import add\n\n\nclass T(unittest.TestCase):\n"
                                      "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")
    return root


def _suite(tmp_path, families, name="s"):
    cfg = tmp_path / "agents.yaml"
    cfg.write_text(yaml.safe_dump({"suites": {name: {"seed": 0, "families": families}}}, sort_keys=False))
    return open_suite(name, cfg, tmp_path / "cache")


def test_names_and_letters():
    table = {"A": "regression", "B": "needle", "C": "rename", "D": "ledger"}
    for letter, name in table.items():
        assert family_name(letter) == family_name(letter.lower()) == family_name(name) == name
        assert get_family(letter).name == name
    assert task_family("A-shlex-9b5d8b52") == task_family("regression-shlex-9b5d8b52") == "regression"
    assert canonical_task_id("C-Node-936a8e2f") == "rename-Node-936a8e2f"
    assert canonical_task_id("ledger-email-b6d97050") == "ledger-email-b6d97050"
    assert task_family("no-such-task") is None and canonical_task_id("no-such-task") == "no-such-task"
    msg = "unknown task family 'E'; families are regression, needle, rename, ledger"
    with pytest.raises(UnknownTaskError, match=msg):
        get_family("E")


def test_config_letters_resolve_and_a_family_twice_is_an_error(tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump({"suites": {"old": {"families": {"D": [{"n": 1}], "B": [{}]}},
                                             "both": {"families": {"D": [{}], "ledger": [{}]}},
                                             "typo": {"families": {"ledgr": [{}]}}}}, sort_keys=False))
    assert list(load_suite_config("old", cfg)["families"]) == ["ledger", "needle"]
    with pytest.raises(AgentHarnessError, match="lists family ledger twice"):
        load_suite_config("both", cfg)
    with pytest.raises(UnknownTaskError, match="suite 'typo': unknown task family 'ledgr'"):
        load_suite_config("typo", cfg)
    default = load_suite_config("default")  # the shipped suites use the names
    assert list(default["families"]) == ["regression", "needle", "rename", "ledger"]


def test_status_never_generates(tmp_path):
    """An entry whose generation would fail still lists: listing reads the config and the cache only."""
    s = _suite(tmp_path, {"regression": [{"n": 1, "modules": ["no_such_module"]}]})
    assert entry_status(s.entries[0], s.cache) == ("missing", [])
    assert not s.cache.exists()
    with pytest.raises(AgentHarnessError, match="no_such_module"):
        entry_tasks(s.entries[0], s.cache)


def test_cache_is_used_and_a_changed_source_is_stale(tmp_path):
    repo = _repo(tmp_path / "repo")
    s = _suite(tmp_path, {"regression": [{"n": 1, "source": str(repo)}]})
    (e,) = s.entries
    first = entry_tasks(e, s.cache)
    assert entry_status(e, s.cache) == ("cached", first)
    path = cache_path(e, s.cache)
    mtime = path.stat().st_mtime_ns
    assert entry_tasks(e, s.cache) == first and path.stat().st_mtime_ns == mtime  # read, not regenerated
    (repo / "lib.py").write_text("def add(a, b):\n    return b + a\n")  # the source the task pins changed
    assert entry_status(e, s.cache)[0] == "stale"
    again = entry_tasks(e, s.cache)
    assert entry_status(e, s.cache) == ("cached", again)
    assert again[0].spec["files"]["lib.py"]["sha256"] != first[0].spec["files"]["lib.py"]["sha256"]


@pytest.mark.parametrize("damage", ["truncate", "edit-body", "bad-header", "not-json", "garbage-bytes", "empty"])
def test_a_damaged_cache_is_corrupt_and_rebuilt(tmp_path, damage):
    s = _suite(tmp_path, {"ledger": [{"n": 1, "n_min": 2, "n_max": 4}]})
    (e,) = s.entries
    good = entry_tasks(e, s.cache)
    path = cache_path(e, s.cache)
    data = path.read_bytes()
    head, _, body = data.partition(b"\n")
    path.write_bytes({"truncate": data[: len(data) // 2],
                      "edit-body": head + b"\n" + body.replace(b'"seed": 0', b'"seed": 1', 1),
                      "bad-header": json.dumps({**json.loads(head), "key": "0" * 16}).encode() + b"\n" + body,
                      "not-json": b"{not json\n" + body,
                      "garbage-bytes": b"\xff\xfe\x00" * 10,
                      "empty": b""}[damage])
    assert entry_status(e, s.cache) == ("corrupt", [])
    assert entry_tasks(e, s.cache) == good
    assert entry_status(e, s.cache) == ("cached", good) and path.read_bytes() == data


def test_find_task_generates_only_the_family_it_names(tmp_path):
    s = _suite(tmp_path, {"ledger": [{"n": 1, "n_min": 2, "n_max": 4}],
                          "regression": [{"n": 1, "modules": ["no_such_module"]}]})
    t = find_task(s, "ledger")
    assert t.family == "ledger" and t.id.startswith("ledger-")
    assert find_task(s, "D") == find_task(s, "d") == find_task(s, t.id) == find_task(s, f"D:{t.id}") == t
    assert find_task(s, "D-" + t.id.partition("-")[2]) == t  # an id from before the names
    assert entry_status(s.entries[1], s.cache)[0] == "missing"  # never generated
    with pytest.raises(UnknownTaskError, match=r"unknown task id 'no-such-task'; known: ledger-"):
        find_task(s, "D:no-such-task")
    with pytest.raises(UnknownTaskError, match="unknown task id 'nope'; known: ids start with their family"):
        find_task(s, "nope")
    with pytest.raises(UnknownTaskError, match="the suite has no family needle task"):
        find_task(s, "needle")
    with pytest.raises(UnknownTaskError, match="unknown task family 'X'"):
        find_task(s, "X:abc")


def test_suite_tasks_filters_families_and_stops_at_the_limit(tmp_path):
    s = _suite(tmp_path, {"ledger": [{"n": 1, "n_min": 2, "n_max": 4}],
                          "regression": [{"n": 1, "modules": ["no_such_module"]}]})
    (t,) = suite_tasks(s, limit=1)  # the second entry is past the limit: not generated (it would raise)
    assert suite_tasks(s, families=["D"]) == suite_tasks(s, families=["ledger"]) == [t]
    with pytest.raises(UnknownTaskError, match="unknown task family 'Q'"):
        suite_tasks(s, families=["Q"])


def test_a_batch_begun_with_letter_ids_resumes_without_redoing_its_tasks(tmp_path):
    """A run directory written before the names (task ids "D-...", family "D"): its finished tasks
    count as done, so nothing is run twice and the report sees one record per task."""
    from agents.batch import run_batch
    from agents.config import AgentConfig
    from agents.oracle import OraclePolicy

    s = _suite(tmp_path, {"ledger": [{"n": 1, "n_min": 2, "n_max": 4}]})
    (task,) = suite_tasks(s)
    out = tmp_path / "run"

    def run():
        return run_batch([task], lambda t: OraclePolicy(t.gold, task_id=t.id), "oracle", {"name": "oracle"},
                         AgentConfig(), out, "s")

    assert run().ran == 1
    for name in ("records.jsonl", "manifest.json"):  # as the same run looked before the names
        p = out / name
        p.write_text(p.read_text().replace(task.id, "D-" + task.id.partition("-")[2]).replace('"family": "ledger"',
                                                                                              '"family": "D"'))
    again = run()
    assert (again.ran, again.skipped) == (0, 1) and len(again.records) == 1
