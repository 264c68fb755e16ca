"""Repository text as prompt units: files cut into line chunks with a header, an excerpt
around a function, and the seeded distractor stream the fitter draws from."""
from __future__ import annotations

import random

CHUNK_LINES = 60


def chunks(path: str, text: str, n_lines: int = CHUNK_LINES) -> list[str]:
    lines = text.splitlines(keepends=True)
    out = []
    for i in range(0, len(lines), n_lines):
        body = "".join(lines[i:i + n_lines])
        out.append(f"# ---- file: {path} (lines {i + 1}-{min(i + n_lines, len(lines))}) ----\n{body}")
    return out


def excerpt(path: str, text: str, start: int, end: int, margin: int = 20) -> str:
    """Lines start-margin .. end+margin (1-based, inclusive) of `text` with a header."""
    lines = text.splitlines(keepends=True)
    a, b = max(1, start - margin), min(len(lines), end + margin)
    return f"# ---- file: {path} (lines {a}-{b}) ----\n" + "".join(lines[a - 1:b])


def distractors(files: dict[str, str], exclude: set[str], seed: int) -> list[str]:
    """Chunks of the other files, files in seeded order, chunks in file order."""
    names = sorted(p for p in files if p not in exclude and files[p].strip())
    random.Random(seed).shuffle(names)
    return [c for p in names for c in chunks(p, files[p])]


def place(units: list[str], needle: str, depth: float) -> str:
    pos = round(depth * len(units))
    return "\n".join(units[:pos] + [needle] + units[pos:])
