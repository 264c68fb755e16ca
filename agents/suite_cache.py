"""The agent-suite cache: one JSONL file per suite entry, written once its tasks are generated.

The file name carries a key over the family, its version, the seed, `n`, the knobs, the code
generation runs (the family module and every module of ours it imports, read statically) and
the Python build. The first line is a header pinning the SHA-256 of the body and of every
source file the tasks were generated from; `read_cache` says "cached" only when all of that
still holds, else "missing", "stale" (a source changed) or "corrupt" (torn, edited, not ours).
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from agents.families import FAMILIES, get_family
from agents.task import AgentTask
from msa_common.atomic import atomic_write_text


@dataclass(frozen=True)
class Entry:
    """One family entry of a suite: `n` tasks of `family` from `knobs` under the suite's seed."""
    family: str  # registered name
    index: int  # position in the suite (config order)
    seed: int
    n: int
    knobs: dict[str, Any] = field(hash=False)


CACHE_SCHEMA = "msa-eval.agent-suite-cache/1"
_CODE_PACKAGES = ("agents", "tasks", "msa_common")  # generation's code: its bytes are in the key

Status = Literal["cached", "missing", "stale", "corrupt"]


def _module_file(root: Path, name: str) -> Path | None:
    if name.partition(".")[0] not in _CODE_PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


_FROM = re.compile(r"^[ \t]*from[ \t]+([A-Za-z_][\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#]*)", re.M)


@cache
def _imports(path: Path) -> list[str]:
    """The absolute imports in a file, at any depth, as module names (a line-based scan: a
    docstring line that looks like an import only adds a file to the hash)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out = [m.split(" as ")[0].strip() for line in _IMPORT.findall(text) for m in line.split(",")]
    for module, names in _FROM.findall(text):
        out += [module] + [f"{module}.{n.split(' as ')[0].strip()}" for n in names.strip("()").split(",") if n.strip()]
    return out


@cache
def _code_hash(family: str) -> str:
    """SHA-256 over the family module and every module of ours it imports, transitively (read
    statically, so the key does not depend on what this process happened to import)."""
    root = Path(__file__).resolve().parent.parent
    seen: dict[str, Path] = {}
    todo = [FAMILIES.table[family].partition(":")[0]]
    while todo:
        name = todo.pop()
        path = _module_file(root, name)
        if path is None or name in seen:
            continue
        seen[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above run on import too
        todo += _imports(path)
    h = hashlib.sha256()
    for p in sorted(seen.values()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def entry_key(entry: Entry) -> str:
    blob = json.dumps({"family": entry.family, "version": get_family(entry.family).version, "seed": entry.seed,
                       "n": entry.n, "knobs": entry.knobs, "code": _code_hash(entry.family), "python": sys.version,
                       "prefix": sys.base_prefix}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_path(entry: Entry, cache: Path) -> Path:
    return Path(cache) / f"{entry.family}-seed{entry.seed}-{entry_key(entry)}.jsonl"


def _sources(tasks: list[AgentTask]) -> dict[str, str]:
    """{absolute path: sha256} of every source file the tasks pin."""
    out: dict[str, str] = {}
    for t in tasks:
        for info in t.spec.get("files", {}).values():
            out[info["path"]] = info["sha256"]
    return dict(sorted(out.items()))


def _file_sha(path: str) -> str | None:
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None


def _key_of(path: Path) -> str:
    return path.stem.rsplit("-", 1)[-1]


def write_cache(entry: Entry, tasks: list[AgentTask], path: Path) -> None:
    body = "".join(json.dumps(t.to_dict(), sort_keys=True) + "\n" for t in tasks)
    header = {"schema": CACHE_SCHEMA, "key": _key_of(path), "family": entry.family,
              "seed": entry.seed, "n": entry.n, "knobs": entry.knobs, "tasks": len(tasks),
              "body_sha256": hashlib.sha256(body.encode()).hexdigest(), "sources": _sources(tasks)}
    atomic_write_text(path, json.dumps(header, sort_keys=True, default=str) + "\n" + body)


def read_cache(path: Path) -> tuple[Status, list[AgentTask]]:
    """("cached", tasks) when the file is whole and its sources unchanged, else (why not, [])."""
    if not path.is_file():
        return "missing", []
    try:
        head, _, body = path.read_bytes().partition(b"\n")
        header = json.loads(head)
        ok = (header.get("schema") == CACHE_SCHEMA and header.get("key") == _key_of(path)
              and header.get("body_sha256") == hashlib.sha256(body).hexdigest())
        tasks = [AgentTask.from_dict(json.loads(line)) for line in body.decode().splitlines()] if ok else []
        ok = ok and len(tasks) == header.get("tasks") and _sources(tasks) == header.get("sources")
    except (ValueError, TypeError, AttributeError, KeyError):  # undecodable, not JSON, or not task-shaped
        ok = False
    if not ok:
        return "corrupt", []
    if any(_file_sha(p) != sha for p, sha in header["sources"].items()):
        return "stale", []
    return "cached", tasks
