"""Task workspaces: a temporary copy of a repository plus a subprocess runner.

THIS IS NOT A SECURITY BOUNDARY. The local sandbox confines the *file tools* to the
workspace (`ConfinedFS`: paths resolving outside it, symlinks swapped in, hard-linked and
non-regular files are refused) and runs commands in a fresh process group with a wall-clock
timeout, a cap on captured output, `PAGER=cat`, and, where `unshare -rn` works, an empty
network namespace; when the command's shell exits, whatever it left in its process group is
killed. A command run through `bash` can still read and write anything the user running
msa-eval can (including files outside the workspace), use all CPU and memory, and leave
daemons behind if they escape the process group (`setsid`). Run
untrusted models inside a VM or container. When a working Docker engine is present
(`docker info` succeeds) `ContainerSandbox` runs the commands in a container instead.

The baseline is a git commit in a separate git dir (outside the workspace), so `diff()` is
exact and the agent's own `git` commands cannot corrupt it.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from agents.confined import ConfinedFS
from agents.errors import EnvironmentFailure, ToolError

DEFAULT_OUTPUT_CHARS = 16_000  # kept in an observation (head + tail)
HARD_OUTPUT_BYTES = 64 * 1024 * 1024  # a command printing more than this is killed
POLL_S = 0.05  # how often a running command is checked for having exited
DRAIN_S = 1.0  # output still read after the command exited and its process group was killed
DEFAULT_IMAGE = os.environ.get("MSA_EVAL_SANDBOX_IMAGE", "python:3.11-slim")  # container sandbox image


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


class Workspace:
    """A temporary directory holding a task's repository, with a git baseline kept outside it.

    files: relative path -> text content (the repository after the task's setup).
    """

    def __init__(self, files: dict[str, str], parent: Path | None = None, python: str | None = None):
        self._tmp = Path(tempfile.mkdtemp(prefix="msa-agent-", dir=parent))
        self.root = self._tmp / "repo"
        self.root.mkdir()
        self.fs = ConfinedFS(self.root)  # what the file tools may touch
        self.scratch = self._tmp / "scratch"  # harness files (test outcomes), outside the diff
        self.scratch.mkdir()
        self._git_dir = self._tmp / "baseline.git"
        self.python = python or _default_python()
        for rel, text in files.items():
            p = self.root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
        self._git("init", "-q")
        self._git("add", "-A")
        self._git("-c", "user.name=msa-eval", "-c", "user.email=msa-eval@localhost",
                  "commit", "-q", "--allow-empty", "-m", "baseline")

    # -- paths -----------------------------------------------------------------
    # -- commands --------------------------------------------------------------
    def env(self) -> dict[str, str]:
        keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR") if k in os.environ}
        keep.update(PAGER="cat", GIT_PAGER="cat", MANPAGER="cat", PYTHONDONTWRITEBYTECODE="1",
                    PYTHONPATH=str(self.root), PYTHONHASHSEED="0", NO_COLOR="1", TERM="dumb")
        return keep

    def run(self, command: str | list[str], timeout_s: float = 60.0, max_chars: int = DEFAULT_OUTPUT_CHARS) -> CommandResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        return run_command(argv, self.root, self.env(), timeout_s, max_chars)

    # -- state -----------------------------------------------------------------
    def _git(self, *args: str) -> str:
        return self._git_bytes(*args).decode("utf-8", "replace")

    def _git_bytes(self, *args: str | bytes) -> bytes:
        r = subprocess.run(["git", f"--git-dir={self._git_dir}", f"--work-tree={self.root}", *args],
                           capture_output=True, timeout=120)
        if r.returncode != 0:
            err = r.stderr.decode("utf-8", "replace").strip()[:300]
            raise EnvironmentFailure(f"git {os.fsdecode(args[0])} failed in the workspace: {err}")
        return r.stdout

    def diff(self, exclude: list[str] | None = None) -> str:
        """Unified diff (binary-safe) of the workspace against the baseline. A file that is not
        UTF-8 (git shows it as text unless it holds a NUL) is diffed as binary, so the patch is text."""
        self._git("add", "-A")
        spec = ["--", "."] + [f":(exclude){p}" for p in (exclude or [])]
        raw = self._git_bytes("diff", "--cached", "--binary", "HEAD", *spec)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
        names = self._git_bytes("diff", "--cached", "--name-only", "-z", "HEAD", *spec).split(b"\0")
        bad = [n for n in names if n and not _is_utf8(self.root / os.fsdecode(n))]
        text = self._git_bytes("diff", "--cached", "--binary", "HEAD", *spec, *[b":(exclude,literal)" + n for n in bad])
        # $GIT_DIR/info/attributes outranks the repository's own .gitattributes (e.g. `*.py diff=python`)
        attrs = self._git_dir / "info" / "attributes"
        attrs.parent.mkdir(exist_ok=True)
        attrs.write_text("* binary\n")
        try:
            binary = self._git_bytes("diff", "--cached", "--binary", "HEAD", "--", *[b":(literal)" + n for n in bad])
        finally:
            attrs.unlink()
        try:
            return (text + binary).decode("utf-8")
        except UnicodeDecodeError as e:
            raise EnvironmentFailure(f"the workspace diff is not UTF-8 even with non-UTF-8 files as binary: {e}") from e

    def apply(self, patch: str) -> None:
        """Apply a diff made by `diff()` (used to resume and to grade on a fresh copy)."""
        if not patch.strip():
            return
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=patch, text=True,
                           cwd=self.root, capture_output=True, timeout=120)
        if r.returncode != 0:
            raise ToolError(f"patch does not apply: {r.stderr.strip()[:300]}")

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_utf8(path: Path) -> bool:
    """Whether the file (or a symlink's target name) is UTF-8, read in bounded chunks; absent: True."""
    import codecs

    try:
        if path.is_symlink():
            os.readlink(os.fsencode(path)).decode("utf-8")
            return True
        dec = codecs.getincrementaldecoder("utf-8")("strict")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                dec.decode(chunk)
        dec.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    except OSError:
        return True
    return True


def _default_python() -> str:
    import sys

    return sys.executable


def docker_available() -> bool:
    """True only when `docker info` succeeds (a reachable engine, not just a client)."""
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class ContainerWorkspace(Workspace):
    """Workspace whose commands run in a Docker container (`--network none`, `--pull never`).

    The workspace's temp dir and the agents package are bind-mounted at their host paths, so
    paths are identical inside and out; file tools act on the host copy. Used only when
    `container_available(image)` holds; nothing is ever pulled."""

    def __init__(self, files: dict[str, str], image: str = DEFAULT_IMAGE, parent: Path | None = None):
        super().__init__(files, parent)
        self.image = image
        self.python = "python3"

    def run(self, command: str | list[str], timeout_s: float = 60.0, max_chars: int = DEFAULT_OUTPUT_CHARS) -> CommandResult:
        inner = command if isinstance(command, str) else " ".join(map(_quote, command))
        pkg = Path(__file__).resolve().parent
        argv = ["docker", "run", "--rm", "--network", "none", "--pull", "never",
                "-v", f"{self._tmp}:{self._tmp}", "-v", f"{pkg}:{pkg}:ro", "-w", str(self.root),
                "-e", f"PYTHONPATH={self.root}", "-e", "PAGER=cat", "-e", "PYTHONDONTWRITEBYTECODE=1",
                self.image, "bash", "-c", inner]
        return run_command(argv, self.root, dict(os.environ), timeout_s, max_chars, no_network=False)


def container_available(image: str = DEFAULT_IMAGE) -> bool:
    """A working engine (`docker info`) and the image already present locally."""
    if not docker_available():
        return False
    try:
        return subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)
