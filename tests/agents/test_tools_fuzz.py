"""Standing fuzz suite for the workspace tools (issue 19): hypothesis drives real tool calls on a real
workspace with arbitrary paths (unicode, `..`, absolute, NUL, lone surrogates, very long names, wrong
types), contents and patterns, interleaved with symbolic and hard links made by real `bash` commands
pointing into a canary directory beside the workspace. Properties, for every call:
  - the result is text or a ToolError (ToolFormatError included), never another exception;
  - no byte is written outside the workspace (the canary directory and the workspace's own siblings
    are unchanged) and no file outside it is read (the canary secret never appears in a result);
  - a write that succeeds reads back exactly.
Bounded for CI: fixed max_examples, derandomize=True, no example database. Counts are printed in the
terminal summary (tests/agents/conftest.py)."""
from __future__ import annotations

import shlex
import shutil
import stat
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.errors import ToolError, ToolFormatError
from agents.sandbox import Workspace
from agents.tools import WorkspaceTools

SECRET = "CANARY-51c2 never readable through the file tools"
MAX_EXAMPLES = 250
LINK_NAMES = ["l1", "pkg/l2", "deep/er/l3"]
FIXED = ["..", ".", "", "pkg", "pkg/a.py", "README", "fifo", "/", "~", "*", "deep/er", *LINK_NAMES,
         "l1/secret.txt", "l1/../README", "pkg/../../README", "../canary/secret.txt"]

texts = st.text(max_size=24)  # any code point, lone surrogates and NUL included
component = st.one_of(st.sampled_from(FIXED), texts, st.just("n" * 300), texts.map(lambda t: t + "\x00" + t))


@st.composite
def paths(draw):
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from([None, 7, ["a"], {"p": 1}, True]))  # wrong types
    if 2 <= kind <= 6:  # through the links examples make
        link = draw(st.sampled_from(LINK_NAMES))
        return link + draw(st.sampled_from(["", "/secret.txt", "/sub/x.py", "/..", "/sub"]))
    p = "/".join(draw(st.lists(component, min_size=1, max_size=4)))
    return ("/" + p) if kind == 1 else p


contents = st.one_of(texts, st.text(max_size=400), st.binary(max_size=64).map(lambda b: b.decode("latin-1")))
patterns = st.one_of(st.sampled_from(["CANARY", "root", "x", "(a+)+$", "(", "[", ".*", "\\"]), texts)
line_no = st.one_of(st.integers(-3, 50), st.just(10**12), st.sampled_from(["2", "x", None]))


def _link_cmd(kind: int, name: str, canary: Path) -> str:
    """A real bash command making a symbolic (kinds 0-5) or hard (6, 7) link at `name`."""
    q, parent = shlex.quote(name), shlex.quote(str(Path(name).parent))
    if kind >= 6:
        target = canary / ("secret.txt" if kind == 6 else "sub/x.py")
        return f"mkdir -p {parent} && ln -fn {shlex.quote(str(target))} {q}"  # -n: replace a link to a dir
    target = [f"{canary}/secret.txt", str(canary), "/etc/passwd", "pkg/a.py", "..", "../.."][kind]
    return f"mkdir -p {parent} && ln -sfn {shlex.quote(target)} {q}"


links = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(LINK_NAMES)), min_size=1, max_size=2)


@st.composite
def calls(draw):
    tool = draw(st.sampled_from(["read_file", "write_file", "str_replace", "search", "list_dir", "bash"]))
    if tool == "bash":  # only the command's bytes are fuzzed (quoted): bash itself is not confined
        return tool, {"command": "printf %s " + shlex.quote(draw(texts))}
    args = {"path": draw(paths())}
    if tool == "read_file":
        for key in ("start_line", "end_line"):
            if draw(st.booleans()):
                args[key] = draw(line_no)
    elif tool == "write_file":
        args["content"] = draw(contents)
    elif tool == "str_replace":
        args.update(old_str=draw(st.one_of(st.sampled_from(["x = 1", "hello", "CANARY"]), texts)),
                    new_str=draw(contents))
    elif tool == "search":
        args = {"pattern": draw(patterns), **({"path": args["path"]} if draw(st.booleans()) else {})}
    if draw(st.integers(0, 19)) == 0:
        args.pop(draw(st.sampled_from(sorted(args))), None)  # a missing argument
    return tool, args


def _snapshot(d: Path) -> dict[str, tuple]:
    """Every entry below `d`: type, permission bits, and content or link target."""
    out = {}
    for p in sorted(d.rglob("*")):
        s = p.lstat()
        body = p.read_bytes() if stat.S_ISREG(s.st_mode) else str(p.readlink()) if p.is_symlink() else None
        out[str(p.relative_to(d))] = (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), body)
    return out


def test_file_tools_under_fuzzing_return_only_tool_errors_and_stay_inside(tmp_path, fuzz_counts):
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "secret.txt").write_text(SECRET + "\n")
    (canary / "sub").mkdir()
    (canary / "sub" / "x.py").write_text(f"# {SECRET}\nx = 1\n")
    ws = Workspace({"pkg/a.py": "x = 1\n", "README": "hello\n", "deep/er/z.py": "z = 0\n"}, parent=tmp_path)
    tools = WorkspaceTools(ws, None, command_timeout_s=5.0)
    tools.call("bash", {"command": "mkfifo fifo"})
    canary_before = _snapshot(canary)
    siblings = sorted(p.name for p in ws.root.parent.iterdir())

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(links, st.lists(calls(), min_size=1, max_size=3))
    def run(made, batch):
        fuzz_counts["examples"] += 1
        for name in LINK_NAMES:  # each example starts without links, so a failure replays alone
            link = ws.root / name
            if link.is_dir() and not link.is_symlink():
                shutil.rmtree(link)  # a directory write_file made at a link's name
            elif link.is_symlink() or link.exists():
                link.unlink()
        for kind, name in made:
            out = tools.call("bash", {"command": _link_cmd(kind, name, canary)})
            assert out.endswith("[exit code 0]"), out
            fuzz_counts["links made with bash"] += 1
        for tool, args in batch:
            fuzz_counts["calls"] += 1
            if any(str(args.get("path")).startswith(name) for _, name in made):
                fuzz_counts["calls through a link"] += 1
            try:
                out = tools.call(tool, args)
            except ToolFormatError:
                fuzz_counts["format errors"] += 1
                continue
            except ToolError as e:
                fuzz_counts["tool errors"] += 1
                assert SECRET not in str(e)
                continue
            except Exception:
                fuzz_counts["other exceptions"] += 1
                raise
            fuzz_counts["ok"] += 1
            assert isinstance(out, str) and SECRET not in out
            if tool == "write_file":
                assert tools.call("read_file", {"path": args["path"]}) == args["content"]
        assert _snapshot(canary) == canary_before
        assert sorted(p.name for p in ws.root.parent.iterdir()) == siblings

    try:
        run()
    finally:
        ws.close()
    fuzz_counts.setdefault("other exceptions", 0)
    assert fuzz_counts["examples"] >= MAX_EXAMPLES and fuzz_counts["tool errors"] > fuzz_counts["examples"] // 4
    assert fuzz_counts["ok"] > 0 and fuzz_counts["links made with bash"] > 0
