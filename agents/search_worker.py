"""The `search` tool's worker process: the model's regular expression over the workspace's files.

It runs apart from the harness so the harness can kill it at the command timeout (Python's `re`
backtracks exponentially on patterns such as `(a+)+$` and cannot be interrupted in-process) and
so its reads never grow the harness's memory. Files are reached through `ConfinedFS` (inside the
workspace, no symlink followed out of it, no hard-linked or non-regular file); `.pyc`/`.pickle`
files are skipped; a file stops at its first NUL byte or invalid UTF-8 (binary); lines longer than
SEGMENT_BYTES are searched in pieces, so a match spanning two pieces is missed.

stdin: JSON {"root", "path", "pattern", "max_hits"}. stdout: `path:line: text` per hit, then notes.
Exit 0 done; 3 the model's mistake (message on stderr); anything else a harness failure.
"""
from __future__ import annotations

import codecs
import json
import re
import sys
from pathlib import Path
from typing import TextIO

from agents.confined import ConfinedFS
from agents.errors import ToolError

SEGMENT_BYTES = 1 << 16
SKIP_SUFFIXES = (".pyc", ".pickle")
TEXT_CHARS = 200  # of each hit line


def search(fs: ConfinedFS, rel: str, rx: re.Pattern[str], max_hits: int, out: TextIO) -> None:
    hits = skipped = 0
    for path in fs.walk(rel):
        if path.endswith(SKIP_SUFFIXES):
            continue
        try:
            lines = fs.lines(path, SEGMENT_BYTES)
        except ToolError:  # a link out of the workspace, a hard link, a FIFO, ...
            skipped += 1
            continue
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        try:
            for i, raw in lines:
                if b"\x00" in raw:
                    break
                line = decoder.decode(raw)
                if rx.search(line):
                    out.write(f"{path}:{i}: {line.strip()[:TEXT_CHARS]}\n")
                    hits += 1
                    if hits >= max_hits:
                        out.write(f"...[stopped at {max_hits} hits; narrow the pattern or path]\n")
                        return
        except (UnicodeDecodeError, OSError):
            continue
    if skipped:
        out.write(f"[skipped {skipped} files: symbolic links leaving the workspace, hard-linked or "
                  "non-regular files]\n")
    if not hits:
        out.write("no matches\n")


def main() -> int:
    req = json.load(sys.stdin)
    try:
        rx = re.compile(req["pattern"])
    except re.error as e:
        print(f"bad regular expression: {e}", file=sys.stderr)
        return 3
    try:
        search(ConfinedFS(Path(req["root"])), req["path"], rx, int(req["max_hits"]), sys.stdout)
    except ToolError as e:
        print(str(e), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
