"""The workspace sandbox: path confinement, timeouts, runaway output, truncation, diffs."""
from __future__ import annotations

import os
import time

import pytest

from agents.errors import ToolError
from agents.sandbox import Workspace
from agents.tools import WorkspaceTools


@pytest.fixture()
def ws(tmp_path):
    w = Workspace({"pkg/a.py": "x = 1\n", "README": "hello\n"}, parent=tmp_path)
    yield w
    w.close()


@pytest.mark.parametrize("bad", ["../outside.txt", "/etc/passwd", "pkg/../../x", "link/secret"])
def test_path_escape_is_refused(ws, tmp_path, bad):
    (tmp_path / "secret").write_text("s")
    os.symlink(tmp_path, ws.root / "link")
    tools = WorkspaceTools(ws, None)
    for name, args in [("read_file", {"path": bad}), ("write_file", {"path": bad, "content": "pwned"}),
                       ("list_dir", {"path": bad})]:
        with pytest.raises(ToolError, match="outside the workspace"):
            tools.call(name, args)
    assert (tmp_path / "secret").read_text() == "s"


def test_hanging_command_is_killed(ws):
    t0 = time.monotonic()
    res = ws.run("sleep 30; echo never", timeout_s=1.0)
    assert res.timed_out and res.exit_code is None
    assert time.monotonic() - t0 < 10
    assert "timed out" in res.render()


def test_background_child_does_not_keep_the_call_alive(ws):
    t0 = time.monotonic()
    res = ws.run("(sleep 30 &) ; echo started", timeout_s=2.0)
    assert "started" in res.output
    assert time.monotonic() - t0 < 10


def test_command_printing_gigabytes_is_killed_and_truncated(ws):
    res = ws.run("yes 0123456789abcdef", timeout_s=60.0, max_chars=2000)
    assert res.output_limit_hit and res.exit_code is None
    assert res.truncated and len(res.output) < 3000
    assert res.output.startswith("0123456789abcdef") and res.output.rstrip().endswith("f")


def test_output_keeps_head_and_tail(ws):
    res = ws.run("seq 1 100000", timeout_s=30.0, max_chars=1000)
    assert res.exit_code == 0 and res.truncated
    assert res.output.startswith("1\n2\n") and res.output.rstrip().endswith("100000")


def test_diff_and_apply_round_trip(ws, tmp_path):
    tools = WorkspaceTools(ws, None)
    tools.call("str_replace", {"path": "pkg/a.py", "old_str": "x = 1", "new_str": "x = 2"})
    tools.call("write_file", {"path": "pkg/new.py", "content": "y = 3\n"})
    patch = ws.diff()
    assert "-x = 1" in patch and "+x = 2" in patch and "pkg/new.py" in patch
    with Workspace({"pkg/a.py": "x = 1\n", "README": "hello\n"}, parent=tmp_path) as fresh:
        fresh.apply(patch)
        assert (fresh.root / "pkg/a.py").read_text() == "x = 2\n"
        assert (fresh.root / "pkg/new.py").read_text() == "y = 3\n"


def test_a_non_utf8_file_round_trips_even_under_a_textual_gitattributes(tmp_path):
    """The repository's own `.gitattributes` (`*.py diff=python`) cannot turn the non-UTF-8 file back into
    a text diff: the patch stays text and applies to a fresh copy byte for byte."""
    files = {"pkg/a.py": "x = 1\n", ".gitattributes": "*.py diff=python\n"}
    with Workspace(files, parent=tmp_path) as ws:
        ws.run("printf 'caf\\xe9 = 1\\n' > pkg/latin1.py", timeout_s=30.0)
        patch = ws.diff()
        assert "GIT binary patch" in patch and ws.diff() == patch
        with Workspace(files, parent=tmp_path) as fresh:
            fresh.apply(patch)
            assert (fresh.root / "pkg/latin1.py").read_bytes() == b"caf\xe9 = 1\n"


def test_str_replace_requires_a_unique_match(ws):
    tools = WorkspaceTools(ws, None)
    (ws.root / "pkg/b.py").write_text("a\na\n")
    with pytest.raises(ToolError, match="occurs 2 times"):
        tools.call("str_replace", {"path": "pkg/b.py", "old_str": "a", "new_str": "b"})
    with pytest.raises(ToolError, match="missing required argument 'old_str'"):
        tools.call("str_replace", {"path": "pkg/b.py", "new_str": "b"})
    assert "pkg/b.py:1: a" in tools.call("search", {"pattern": "^a$"})
