"""Whole-file writes that leave either the old file or the new one, never a mix.

The data goes to a temporary file beside the target (same directory, so the rename stays on
one file system), is flushed and fsynced, and `os.replace` puts it in place; the directory is
fsynced where the platform allows it, so the rename survives a crash too. On any error (or
interrupt) the temporary file is removed and the target is left as it was. The temporary file
is created with mode 0666 less the umask, like a plain `open(path, "w")`.

`atomic_write_bytes/text/json` write a value; `atomic_open` streams into the file (the target
is replaced only when the block ends without an error, so a check inside the block can still
refuse the file); `atomic_path` hands a temporary path to writers that only take a file name
(matplotlib's `savefig`, safetensors' `save_file`).
"""
from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _temp_beside(path: Path, suffix: str) -> Path:
    """Create (exclusively) an empty temporary file in `path`'s directory and return its path."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_quietly(path: Path) -> None:
    """fsync a file or a directory (a directory: makes a rename in it durable); skipped where the
    platform cannot open or sync it."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path` (ending in `suffix`) to write to; when the block ends
    without an error the file is fsynced and replaces `path`, otherwise it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path, suffix)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_quietly(path.parent)


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """An open file (mode "wb" or "w") whose content replaces `path` when the block ends without an error."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes a whole file: mode must be 'wb' or 'w', not {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, encoding=encoding if mode == "w" else None) as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, **dumps: Any) -> None:
    """`obj` as JSON text plus a newline; `dumps` go to `json.dumps` (defaults: indent=2, and
    values JSON cannot hold written as `str(value)`; pass `default=None` to refuse them)."""
    dumps.setdefault("indent", 2)
    dumps.setdefault("default", str)
    atomic_write_text(path, json.dumps(obj, **dumps) + "\n")
