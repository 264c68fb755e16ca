"""Task workspaces: a temporary copy of a repository plus a subprocess runner (`WorkDir`, from
`tasks/repo/workdir.py`, which the repository tasks use to run tests) with the agent's file
tools confined to it and a git baseline.

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
import shutil
import subprocess
from pathlib import Path

from agents.confined import ConfinedFS
from agents.errors import EnvironmentFailure, ToolError
from tasks.repo.unittests import RUNNER
from tasks.repo.workdir import DEFAULT_OUTPUT_CHARS, CommandResult, WorkDir, run_command

DEFAULT_IMAGE = os.environ.get("MSA_EVAL_SANDBOX_IMAGE", "python:3.11-slim")  # container sandbox image


class Workspace(WorkDir):
    """A task's repository in a `WorkDir`, with the file tools confined to it (`fs`) and a git
    baseline kept outside it.

    files: relative path -> text content (the repository after the task's setup).
    """

    def __init__(self, files: dict[str, str], parent: Path | None = None, python: str | None = None):
        super().__init__(files, parent, python)
        self.fs = ConfinedFS(self.root)  # what the file tools may touch
        self._git_dir = self._tmp / "baseline.git"
        self._git("init", "-q")
        self._git("add", "-A")
        self._git("-c", "user.name=msa-eval", "-c", "user.email=msa-eval@localhost",
                  "commit", "-q", "--allow-empty", "-m", "baseline")

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

    def __enter__(self) -> Workspace:
        return self


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

    The workspace's temp dir and the test runner's folder are bind-mounted at their host paths, so
    paths are identical inside and out; file tools act on the host copy. Used only when
    `container_available(image)` holds; nothing is ever pulled."""

    def __init__(self, files: dict[str, str], image: str = DEFAULT_IMAGE, parent: Path | None = None):
        super().__init__(files, parent)
        self.image = image
        self.python = "python3"

    def run(self, command: str | list[str], timeout_s: float = 60.0,
            max_chars: int = DEFAULT_OUTPUT_CHARS) -> CommandResult:
        inner = command if isinstance(command, str) else " ".join(map(_quote, command))
        pkg = RUNNER.resolve().parent  # the test runner (run_unittests) must be readable inside
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
