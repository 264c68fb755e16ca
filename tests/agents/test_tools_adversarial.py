"""Issue 19, defects 3, 4, 5 and the bash part of 13: the workspace tools against a hostile or careless
model. Every input the model controls comes back as a ToolError (and the episode, run through the real
loop, is graded and ends with a named exit); the file tools cannot read or write outside the workspace
through symbolic or hard links made with the real `bash` tool; huge files and catastrophic regular
expressions neither grow the harness nor hang it; a background child never holds a command open."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agents.config import AgentConfig
from agents.errors import ToolError
from agents.oracle import OraclePolicy
from agents.run_one import run_task
from agents.sandbox import Workspace
from agents.tools import WorkspaceTools
from agents.trajectory import read_trajectory

SECRET = "CANARY-7f3a secret outside the workspace\n"


@pytest.fixture()
def ws(tmp_path):
    w = Workspace({"pkg/a.py": "x = 1\n", "README": "hello\n"}, parent=tmp_path)
    yield w
    w.close()


@pytest.fixture()
def canary(tmp_path):
    d = tmp_path / "canary"
    d.mkdir()
    (d / "secret.txt").write_text(SECRET)
    return d


def _tools(ws, timeout_s=10.0):
    return WorkspaceTools(ws, None, command_timeout_s=timeout_s)


def _bash(tools, command):
    out = tools.call("bash", {"command": command})
    assert out.endswith("[exit code 0]"), out
    return out


# -- defect 3: every model-controlled input error is a ToolError ------------------------------------
MODEL_ERRORS = [
    ("write_file", {"path": "pkg", "content": "x"}, "is a directory"),
    ("write_file", {"path": "README/x.py", "content": "x"}, "a parent of the path is a file"),
    ("str_replace", {"path": "bin.dat", "old_str": "a", "new_str": "b"}, "is not UTF-8 text (byte 0xff at offset 0)"),
    ("write_file", {"path": "n" * 300 + ".py", "content": "x"}, "at most 255 bytes"),
    ("read_file", {"path": "pkg/" + "n" * 300}, "at most 255 bytes"),
    ("read_file", {"path": "pkg/a\x00.py"}, "contains a NUL byte"),
    ("write_file", {"path": "a\x00b", "content": "x"}, "contains a NUL byte"),
    ("list_dir", {"path": "pkg\x00"}, "contains a NUL byte"),
    ("search", {"pattern": "x", "path": "pkg\x00"}, "contains a NUL byte"),
    ("bash", {"command": "echo a\x00b"}, "contains a NUL byte"),
    ("write_file", {"path": "s.py", "content": "x = '\ud800'"}, "lone surrogate"),
    ("read_file", {"path": "pkg/\ud800.py"}, "lone surrogate"),
    ("read_file", {"path": "pkg"}, "is a directory"),
    ("read_file", {"path": "fifo"}, "not a regular file"),
    ("str_replace", {"path": "nope.py", "old_str": "a", "new_str": "b"}, "no such file"),
    ("search", {"pattern": "(unclosed"}, "bad regular expression"),
    ("search", {"pattern": "x", "path": "nope"}, "no such file"),
]


@pytest.mark.parametrize("name,args,message", MODEL_ERRORS, ids=[f"{n}-{m[:24]}" for n, _, m in MODEL_ERRORS])
def test_model_input_errors_come_back_as_tool_errors(ws, name, args, message):
    tools = _tools(ws)
    _bash(tools, PREP)
    before = ws.diff()
    with pytest.raises(ToolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tools.call(name, args)
    assert ws.diff() == before  # nothing half-written


PREP = ("mkdir -p pkg && echo 'x = 1' > pkg/a.py && echo hello > README && printf '\\xff\\xfeabc' > bin.dat "
        "&& mkfifo fifo")


def _bad_calls():
    """The fixture's workspace recreated with bash, then every bad call the file tools of a regression task take."""
    # regression tasks have no list_dir/search
    bad = [(n, a) for n, a, _ in MODEL_ERRORS if n not in ("list_dir", "search")]
    return [{"name": "bash", "arguments": {"command": PREP}}] + [{"name": n, "arguments": a} for n, a in bad]


def test_an_episode_of_bad_calls_is_graded_and_solved_through_the_real_loop(agent_cache, tmp_path):
    from agents.families import get_family

    (task,) = get_family("A").generate(0, 1, modules=["colorsys"])
    gold = _bad_calls() + task.gold
    res = run_task(task, OraclePolicy(gold), AgentConfig(), tmp_path / "t.jsonl")
    assert res.status == "submitted" and res.score == 1.0, res.grade
    steps = read_trajectory(tmp_path / "t.jsonl").steps
    obs = [s["observations"][0] for s in steps[1:len(_bad_calls())]]
    assert [o["error"] for o in obs] == ["tool"] * len(obs)  # each one a tool error, none a format error
    assert all(s["messages"][1]["content"].startswith("error: ") for s in steps[1:len(_bad_calls())])


def test_a_tool_failing_in_the_harness_ends_with_environment_error_and_is_graded(agent_cache, tmp_path):
    """The model deletes the harness's scratch directory with bash; run_tests then raises
    FileNotFoundError inside the harness: not a tool error, so the run ends, recorded and graded."""
    from agents.families import get_family

    (task,) = get_family("A").generate(0, 1, modules=["colorsys"])
    gold = [{"name": "bash", "arguments": {"command": "rm -rf ../scratch"}},
            {"name": "run_tests", "arguments": {}}, *task.gold]
    res = run_task(task, OraclePolicy(gold), AgentConfig(), tmp_path / "t.jsonl")
    assert res.status == "environment_error" and res.steps == 2
    assert "tool 'run_tests' failed in the harness: FileNotFoundError" in res.error
    t = read_trajectory(tmp_path / "t.jsonl")
    assert t.result["status"] == "environment_error" and t.result["grade"]["resolved"] == "NO"
    assert t.steps[-1]["observations"][0]["error"] == "harness" and len(t.steps) == 2


# -- defect 4: confinement against links made with bash --------------------------------------------
def test_search_does_not_follow_symlinks_out_of_the_workspace(ws, canary):
    tools = _tools(ws)
    _bash(tools, f"ln -s /etc/passwd pw && ln -s {canary}/secret.txt s && ln -s {canary} d && ln -s pkg/a.py inside")
    out = tools.call("search", {"pattern": "root|CANARY"})
    assert "root:" not in out and "CANARY" not in out and out.endswith("no matches")
    assert out.startswith("[skipped 3 files: symbolic links leaving the workspace")  # 2 file links, 1 dir link
    assert "inside:1: x = 1" in tools.call("search", {"pattern": "x = 1"})  # a link inside the workspace is fine
    for path in ("pw", "s", "d/secret.txt"):
        with pytest.raises(ToolError, match="outside the workspace"):
            tools.call("read_file", {"path": path})


def test_hard_links_out_of_the_workspace_are_refused(ws, canary):
    tools = _tools(ws)
    _bash(tools, f"ln {canary}/secret.txt hard")
    for name, args in [("write_file", {"path": "hard", "content": "PWNED"}), ("read_file", {"path": "hard"}),
                       ("str_replace", {"path": "hard", "old_str": "CANARY", "new_str": "PWNED"})]:
        with pytest.raises(ToolError, match="2 hard links"):
            tools.call(name, args)
    assert "CANARY" not in tools.call("search", {"pattern": "CANARY"})
    assert (canary / "secret.txt").read_text() == SECRET


def test_a_symlinked_parent_swapped_in_is_not_followed(ws, canary):
    """Resolution and opening are separate steps; the open walks the resolved components with
    O_NOFOLLOW, so a directory replaced by a link to the canary in between is refused."""
    fs = ws.fs
    parts = fs.locate("pkg/a.py")
    os.rename(ws.root / "pkg", ws.root / "pkg.real")
    os.symlink(canary, ws.root / "pkg")
    with pytest.raises(OSError):
        fs.open_dir(parts[:-1])
    with pytest.raises(ToolError, match="outside the workspace"):
        _tools(ws).call("write_file", {"path": "pkg/secret.txt", "content": "PWNED"})
    assert (canary / "secret.txt").read_text() == SECRET


def test_writes_are_atomic_and_keep_the_mode(ws):
    tools = _tools(ws)
    _bash(tools, "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod 755 run.sh")
    tools.call("str_replace", {"path": "run.sh", "old_str": "hi", "new_str": "bye"})
    assert (ws.root / "run.sh").stat().st_mode & 0o777 == 0o755
    assert tools.call("bash", {"command": "./run.sh"}).startswith("bye")
    with pytest.raises(ToolError, match="lone surrogate"):
        tools.call("str_replace", {"path": "run.sh", "old_str": "bye", "new_str": "\udcff"})
    assert (ws.root / "run.sh").read_text() == "#!/bin/sh\necho bye\n"
    assert not [p for p in ws.root.iterdir() if p.name.startswith(".msa-write")]  # no temp file left
    tools.call("write_file", {"path": "crlf.txt", "content": "a\r\nb\r\n"})
    tools.call("str_replace", {"path": "crlf.txt", "old_str": "a\r\n", "new_str": "c\r\n"})
    assert (ws.root / "crlf.txt").read_bytes() == b"c\r\nb\r\n"  # bytes kept, no newline translation


# -- defect 5: bounded memory, bounded time ---------------------------------------------------------
_RSS_PROBE = textwrap.dedent("""
    import json, sys
    from agents.sandbox import Workspace
    from agents.tools import WorkspaceTools
    from agents.errors import ToolError

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    ws = Workspace({"README": "hi\\n"}, parent=sys.argv[1])
    t = WorkspaceTools(ws, None, command_timeout_s=60)
    t.call("bash", {"command": "for i in $(seq 2000); do echo needle $i; done > big && truncate -s 1G big"})
    t.call("read_file", {"path": "README"}); t.call("search", {"pattern": "hi", "path": "README"})  # warm-up
    before = hwm()
    out = {"head": t.call("read_file", {"path": "big"})[-80:],
           "search": t.call("search", {"pattern": "needle 1999$|zzz"}),
           "search_nohit": t.call("search", {"pattern": "zzz", "path": "big"})}
    try:
        t.call("read_file", {"path": "big", "start_line": 3000})
    except ToolError as e:
        out["deep"] = str(e)
    out["size"] = (ws.root / "big").stat().st_size
    out["growth"] = hwm() - before
    print(json.dumps(out))
""")


def test_a_one_gigabyte_sparse_file_is_read_and_searched_in_bounded_memory(tmp_path):
    r = subprocess.run([sys.executable, "-c", _RSS_PROBE, str(tmp_path)], capture_output=True, text=True,
                       timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["size"] == 1 << 30
    print(f"harness peak RSS growth over read_file + search of a 1 GiB file: {out['growth'] >> 10} KiB")
    assert out["growth"] < 64 << 20, f"harness peak RSS grew by {out['growth'] >> 20} MiB"
    assert out["head"].endswith("[truncated at 60000 chars; read a line range]")
    assert out["search"] == "big:1999: needle 1999" and out["search_nohit"] == "no matches"
    assert "beyond the first 256 MiB" in out["deep"] and "use bash" in out["deep"]


def test_a_catastrophic_regex_is_stopped_at_the_command_timeout(ws):
    (ws.root / "pkg/b.py").write_text("a" * 32 + "b\n")  # re: ~40 s on 2 CPU cores, doubling per 2 characters
    tools = _tools(ws, timeout_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(ToolError, match=r"did not finish within the 2 s command timeout; simplify the pattern"):
        tools.call("search", {"pattern": "(a+)+$"})
    assert time.monotonic() - t0 < 4.0
    assert tools.call("search", {"pattern": "a+b$"}) == "pkg/b.py:1: " + "a" * 32 + "b"  # and it still works


# -- defect 13 (bash part): a background child does not hold the command open ----------------------
def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, killed and awaiting its reaper, counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize("command,code", [("sleep 100 & echo $!", 0), ("(sleep 100 & echo $!)", 0),
                                          ("sleep 100 & echo $!; exit 3", 3)])
def test_a_background_child_is_killed_when_the_shell_exits(ws, command, code):
    t0 = time.monotonic()
    res = ws.run(command, timeout_s=20.0)
    assert time.monotonic() - t0 < 3.0
    assert not res.timed_out and res.exit_code == code, res.render()
    assert res.render().endswith(f"[exit code {code}]") and "timed out" not in res.render()
    pid = int(res.output.split()[0])
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"background child {pid} survived the command"


def test_a_child_escaping_the_group_does_not_hang_the_call_either(ws):
    """`setsid` leaves the process group: it is not killed (bash is no security boundary, see the
    sandbox docstring), but the call still returns about DRAIN_S after the shell exits."""
    t0 = time.monotonic()
    res = ws.run("setsid sleep 100 & echo $!", timeout_s=20.0)
    pid = int(res.output.split()[0])
    try:
        assert time.monotonic() - t0 < 4.0 and res.exit_code == 0 and not res.timed_out
    finally:
        os.kill(pid, 9)
