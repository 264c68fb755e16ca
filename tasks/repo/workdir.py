"""A temporary copy of a repository and a runner for commands in it.

`run_command` runs a command in its own process group with a wall-clock timeout and a cap on
captured output (head and tail kept), and, where `unshare -rn` works, in an empty network
namespace; when the command exits, whatever it left in its process group is killed.
`WorkDir` holds a repository's files in a fresh temporary directory (plus a scratch folder
outside the repository) and runs commands there with a small fixed environment. The
repository tasks run their tests in one; the agents' `Workspace` extends it with confined
file tools and a git baseline. None of this is a security boundary (see agents/sandbox.py).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from msa_common.errors import EnvironmentFailure

DEFAULT_OUTPUT_CHARS = 16_000  # kept in an observation (head + tail)
HARD_OUTPUT_BYTES = 64 * 1024 * 1024  # a command printing more than this is killed
POLL_S = 0.05  # how often a running command is checked for having exited
DRAIN_S = 1.0  # output still read after the command exited and its process group was killed


@dataclass
class CommandResult:
    exit_code: int | None  # None when killed (timeout / output limit)
    output: str  # stdout+stderr, head and tail kept when truncated
    timed_out: bool = False
    output_limit_hit: bool = False
    truncated: bool = False
    total_bytes: int = 0
    duration_s: float = 0.0

    def render(self) -> str:
        """The observation text the model sees."""
        head = []
        if self.timed_out:
            head.append(f"[command timed out after {self.duration_s:.0f}s and was killed]")
        if self.output_limit_hit:
            head.append(f"[command killed: printed more than {HARD_OUTPUT_BYTES} bytes]")
        if self.truncated:
            head.append(f"[output truncated: {self.total_bytes} bytes, head and tail shown]")
        tail = "" if self.exit_code is None else f"\n[exit code {self.exit_code}]"
        return "\n".join(head + [self.output]) + tail


def _network_wrapper() -> list[str]:
    """`unshare -rn` (no network) when this kernel allows unprivileged namespaces."""
    try:
        ok = shutil.which("unshare") is not None and subprocess.run(
            ["unshare", "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:  # said once per process: the commands of this run keep the host's network
        warnings.warn("`unshare -rn` is not available here: agent commands run WITH network access "
                      "(use a container workspace to cut it)", RuntimeWarning, stacklevel=2)
    return ["unshare", "-rn"] if ok else []


_NET_WRAPPER: list[str] | None = None


def run_command(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float,
                max_chars: int = DEFAULT_OUTPUT_CHARS, no_network: bool = True) -> CommandResult:
    """Run `argv` in its own process group and return when that process exits, with its exit code;
    the group (background children included) is killed then, and on timeout or runaway output."""
    global _NET_WRAPPER
    if no_network:
        if _NET_WRAPPER is None:
            _NET_WRAPPER = _network_wrapper()
        argv = _NET_WRAPPER + argv
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        raise EnvironmentFailure(f"cannot start {argv[0]!r}: {e}") from e
    assert proc.stdout is not None  # stdout=PIPE
    half = max_chars // 2
    head = bytearray()
    tail: deque[bytes] = deque()
    tail_len = 0
    total = 0
    timed_out = limit_hit = False
    fd = proc.stdout.fileno()
    exited_at = None  # when the command's own process ended
    while True:
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            # the command is done: children it left in its group (`sleep 100 &`) are killed, so the
            # pipe reaches EOF once the output they already wrote has been read
            exited_at = now
            _kill_group(proc)
        if exited_at is not None and now - exited_at > DRAIN_S:
            break  # a process outside the group (setsid) still holds the pipe open: stop reading
        if exited_at is None and now - t0 >= timeout_s:
            timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        total += len(chunk)
        if len(head) < half:
            take = half - len(head)
            head += chunk[:take]
            chunk = chunk[take:]
        if chunk:
            tail.append(chunk)
            tail_len += len(chunk)
            while tail and tail_len - len(tail[0]) >= half:
                tail_len -= len(tail.popleft())
        if total > HARD_OUTPUT_BYTES:
            limit_hit = True
            break
    if timed_out or limit_hit:
        _kill_group(proc)
    else:
        try:
            proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    _kill_group(proc)  # reap stragglers left in the group
    proc.stdout.close()
    tail_bytes = b"".join(tail)
    truncated = total > len(head) + len(tail_bytes)
    text = head.decode("utf-8", "replace")
    if truncated:
        text += "\n...[truncated]...\n"
    text += tail_bytes[-half:].decode("utf-8", "replace") if truncated else tail_bytes.decode("utf-8", "replace")
    code = None if (timed_out or limit_hit) else proc.returncode
    return CommandResult(code, text, timed_out, limit_hit, truncated, total, time.monotonic() - t0)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class WorkDir:
    """A temporary directory holding a repository (`root`) and a `scratch` folder beside it.

    files: relative path -> text content. Commands run in `root` with `root` on PYTHONPATH.
    """

    def __init__(self, files: dict[str, str], parent: Path | None = None, python: str | None = None):
        self._tmp = Path(tempfile.mkdtemp(prefix="msa-agent-", dir=parent))
        self.root = self._tmp / "repo"
        self.root.mkdir()
        self.scratch = self._tmp / "scratch"  # harness files (test outcomes), outside the repository
        self.scratch.mkdir()
        self.python = python or sys.executable
        for rel, text in files.items():
            p = self.root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")

    def env(self) -> dict[str, str]:
        keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR") if k in os.environ}
        keep.update(PAGER="cat", GIT_PAGER="cat", MANPAGER="cat", PYTHONDONTWRITEBYTECODE="1",
                    PYTHONPATH=str(self.root), PYTHONHASHSEED="0", NO_COLOR="1", TERM="dumb")
        return keep

    def run(self, command: str | list[str], timeout_s: float = 60.0,
            max_chars: int = DEFAULT_OUTPUT_CHARS) -> CommandResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        return run_command(argv, self.root, self.env(), timeout_s, max_chars)

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
