"""Confined file access for the workspace file tools (read_file, write_file, str_replace, search, list_dir).

A path the model names is first resolved (symlinks followed, `..` folded) and refused unless it
lies inside the workspace root; the canonical components are then opened one at a time from the
root's directory fd with O_NOFOLLOW, so a symlink swapped in meanwhile is refused, never followed.
Regular files with more than one hard link are refused (a link made with `bash` may name a file
outside the workspace), and only regular files and directories are opened (no FIFOs or devices).
Reads are bounded in bytes; writes go to a temporary file in the same directory and are renamed
over the target, so a failed write leaves the old file whole and a write never goes through a link.

Every failure caused by the path or content the model chose is a `ToolError` naming the fix.
Limit (stated, not hidden): parent directories created for a write that then fails are left.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from agents.errors import ToolError

NAME_MAX_BYTES = 255  # Linux NAME_MAX
PATH_MAX_BYTES = 4095  # Linux PATH_MAX, less the terminating NUL
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

_HINTS = {  # errno -> what the model should do instead
    errno.ENOENT: "no such file or directory; check the path with list_dir",
    errno.ENOTDIR: "a parent of the path is a file, not a directory; pick another path",
    errno.EEXIST: "a parent of the path is a file, not a directory; pick another path",
    errno.EISDIR: "is a directory; pass a file path (list_dir shows a directory)",
    errno.ELOOP: "goes through a symbolic link; use the link's target path",
    errno.ENAMETOOLONG: f"a name is longer than {NAME_MAX_BYTES} bytes; use a shorter name",
    errno.EACCES: "permission denied; pick a file you can access",
    errno.EPERM: "operation not permitted; pick a file you can access",
    errno.ENOSPC: "no space left on the device; delete files you created",
    errno.EROFS: "the file system is read-only",
}


def tool_error(rel: str, e: OSError) -> ToolError:
    """The model-facing error for an OSError raised on the path `rel` the model named."""
    hint = _HINTS.get(e.errno or 0, f"{e.strerror or e}; pick another path")
    return ToolError(f"{rel!r}: {hint}")


class ConfinedFS:
    """File operations under `root` that cannot reach outside it through `..`, symlinks or hard links."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()

    # -- locating -------------------------------------------------------------
    def locate(self, rel: str) -> tuple[str, ...]:
        """The canonical components of `rel` below the root (() is the root itself)."""
        if not isinstance(rel, str) or not rel.strip():
            raise ToolError("path must be a non-empty string relative to the repository root")
        if "\x00" in rel:
            raise ToolError(f"path {rel!r} contains a NUL byte; remove it")
        try:
            raw = os.fsencode(rel)
        except UnicodeEncodeError:
            raise ToolError(f"path {rel!r} is not valid UTF-8 text (a lone surrogate); fix the name") from None
        if len(raw) > PATH_MAX_BYTES or any(len(c) > NAME_MAX_BYTES for c in raw.split(b"/")):
            raise ToolError(f"path {rel[:80]!r}... is too long: each name must be at most {NAME_MAX_BYTES} bytes "
                            f"and the path at most {PATH_MAX_BYTES}; use a shorter name")
        try:
            p = Path(os.path.realpath(self.root / rel))
        except OSError as e:  # realpath is lenient; this is a symlink loop or similar
            raise tool_error(rel, e) from e
        if p != self.root and self.root not in p.parents:
            raise ToolError(f"path {rel!r} is outside the workspace; use a path relative to the repository root")
        return p.relative_to(self.root).parts

    def open_dir(self, parts: tuple[str, ...], create: bool = False) -> int:
        """An fd of the directory `parts` (created if asked), reached without following links."""
        fd = os.open(self.root, _DIR)
        try:
            for name in parts:
                if create:
                    try:
                        os.mkdir(name, dir_fd=fd)
                    except FileExistsError:
                        pass
                nxt = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_file(self, rel: str) -> int:
        """A read fd of the regular, singly-linked file at `rel`."""
        parts = self.locate(rel)
        if not parts:
            raise ToolError(f"{rel!r} is the repository root, a directory; pass a file path")
        try:
            dfd = self.open_dir(parts[:-1])
            try:
                fd = os.open(parts[-1], _FILE, dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise tool_error(rel, e) from e
        try:
            check_regular(fd, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- reading --------------------------------------------------------------
    def read_bytes(self, rel: str, max_bytes: int) -> bytes:
        """The whole file, refused (before reading) when it is larger than `max_bytes`."""
        fd = self.open_file(rel)
        try:
            size = os.fstat(fd).st_size
            if size > max_bytes:
                raise ToolError(f"{rel!r} is {size} bytes, over the {max_bytes}-byte limit of this tool; "
                                "use bash (sed, python) for a file this large")
            return read_upto(fd, max_bytes)
        finally:
            os.close(fd)

    def lines(self, rel: str, segment_bytes: int) -> Iterator[tuple[int, bytes]]:
        """(1-based line number, bytes) for each line split at b"\\n"; lines longer than
        `segment_bytes` come in pieces carrying the same number. Memory stays bounded.
        The file is opened (and refused) now, read as the iterator is consumed."""
        return numbered_lines(os.fdopen(self.open_file(rel), "rb", buffering=1 << 16), segment_bytes)

    def walk(self, rel: str) -> Iterator[str]:
        """Paths (relative to the root) of every non-directory entry under `rel`, sorted, without
        descending into symbolic links; `rel` itself when it is not a directory."""
        parts = self.locate(rel)
        try:
            fd = self.open_dir(parts)
        except OSError as e:
            if e.errno != errno.ENOTDIR:
                raise tool_error(rel, e) from e
            return iter(["/".join(parts)])
        return _walk_fd(fd, parts)

    def list_dir(self, rel: str) -> list[str]:
        """Names in the directory: `name/` for a directory, `name@` for a symbolic link."""
        try:
            fd = self.open_dir(self.locate(rel))
        except OSError as e:
            raise ToolError(f"not a directory: {rel!r} ({_HINTS.get(e.errno or 0, e.strerror)})") from e
        try:
            with os.scandir(fd) as it:
                return sorted(display(en.name) + ("@" if en.is_symlink() else "/" if en.is_dir(follow_symlinks=False)
                                                  else "") for en in it)
        finally:
            os.close(fd)

    # -- writing --------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> None:
        """Replace (or create) the file at `rel` with `data`, all or nothing; parents are created."""
        parts = self.locate(rel)
        if not parts:
            raise ToolError(f"{rel!r} is the repository root, a directory; pass a file path")
        name = parts[-1]
        try:
            dfd = self.open_dir(parts[:-1], create=True)
        except OSError as e:
            raise tool_error(rel, e) from e
        try:
            mode = _existing_mode(dfd, name, rel)
            tmp = f".msa-write-{secrets.token_hex(6)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666,
                             dir_fd=dfd)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    if mode is not None:
                        os.fchmod(fd, mode)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as e:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise tool_error(rel, e) from e
        finally:
            os.close(dfd)


def display(name: str) -> str:
    """A file name as clean text: bytes that are not UTF-8 shown as backslash escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_regular(fd: int, rel: str) -> os.stat_result:
    """Refuse directories, non-regular files and regular files with several hard links."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{rel!r} is a directory; pass a file path (list_dir shows a directory)")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{rel!r} is not a regular file (a FIFO, socket or device); "
                        "the file tools open regular files only")
    if st.st_nlink > 1:
        raise ToolError(f"{rel!r} has {st.st_nlink} hard links (one may be outside the workspace); the file tools "
                        "refuse hard-linked files: replace it with a copy (cp f f.tmp && mv f.tmp f)")
    return st


def _existing_mode(dfd: int, name: str, rel: str) -> int | None:
    """The permission bits of the file being replaced (None when it does not exist yet)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise tool_error(rel, e) from e
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{rel!r} is a directory; pass a file path (list_dir shows a directory)")
    if stat.S_ISLNK(st.st_mode):
        raise ToolError(f"{rel!r} is a symbolic link; write to the link's target path")
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"{rel!r} is not a regular file; the file tools write regular files only")
    if st.st_nlink > 1:
        raise ToolError(f"{rel!r} has {st.st_nlink} hard links (one may be outside the workspace); the file tools "
                        "refuse hard-linked files: delete it first (rm) and write it anew")
    return stat.S_IMODE(st.st_mode)


def read_upto(fd: int, limit: int) -> bytes:
    """At most `limit` bytes from `fd`."""
    out = bytearray()
    while len(out) < limit:
        chunk = os.read(fd, min(1 << 20, limit - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def numbered_lines(f: BinaryIO, segment_bytes: int) -> Iterator[tuple[int, bytes]]:
    with f:
        n = 1
        while seg := f.readline(segment_bytes):
            yield n, seg
            n += seg.endswith(b"\n")


def _walk_fd(fd: int, parts: tuple[str, ...]) -> Iterator[str]:
    """Depth first, names sorted at each level (the order of sorting full paths by components)."""
    try:
        with os.scandir(fd) as it:
            entries = sorted((en.name, en.is_dir(follow_symlinks=False)) for en in it)
        for name, is_dir in entries:
            if not is_dir:
                yield "/".join(parts + (name,))
                continue
            try:
                sub = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                continue  # replaced or removed meanwhile
            yield from _walk_fd(sub, parts + (name,))
    finally:
        os.close(fd)
