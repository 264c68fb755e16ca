"""Family D's database: facts read from a real package (functions, their sources, the
exceptions they raise, which tests reference them) plus seeded synthetic owners and
distractor tickets. Built deterministically from pinned source bytes and a seed."""
from __future__ import annotations

import ast
import random
from dataclasses import dataclass, field
from functools import lru_cache

from tasks.repo.sources import load_pinned

OWNERS = ("ada", "grace", "linus", "guido", "barbara", "ken", "dennis", "margaret", "edsger", "donald",
          "frances", "john")


@dataclass(frozen=True)
class FunctionFact:
    qualname: str  # "email.utils:formatdate" or "email.message:Message.get"
    module: str
    name: str
    toplevel: bool
    signature: str
    lines: int
    raises: tuple[str, ...]
    docstring: str
    source: str


@dataclass
class LedgerFacts:
    functions: dict[str, FunctionFact] = field(default_factory=dict)
    tests: dict[str, tuple[str, frozenset[str]]] = field(default_factory=dict)  # id -> (source, names used)
    owners: dict[str, str] = field(default_factory=dict)  # module -> owner

    def tests_referencing(self, name: str) -> list[str]:
        return sorted(t for t, (_, names) in self.tests.items() if name in names)


def _raises(fn: ast.AST) -> tuple[str, ...]:
    out = set()
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(n, ast.Raise) and n.exc is not None:
            e = n.exc.func if isinstance(n.exc, ast.Call) else n.exc
            if isinstance(e, ast.Name):
                out.add(e.id)
            elif isinstance(e, ast.Attribute):
                out.add(e.attr)
        stack.extend(ast.iter_child_nodes(n))
    return tuple(sorted(out))


def _segment(lines: list[str], node: ast.stmt) -> str:
    """Whole source lines of `node` (ast.get_source_segment re-splits the file per call)."""
    return "".join(lines[node.lineno - 1:node.end_lineno])


def _functions(module: str, text: str) -> list[FunctionFact]:
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    out = []

    def add(fn, prefix: str, top: bool) -> None:
        src = _segment(lines, fn)
        doc = ast.get_docstring(fn) or ""
        out.append(FunctionFact(f"{module}:{prefix}{fn.name}", module, fn.name, top,
                                f"{fn.name}({ast.unparse(fn.args)})", fn.end_lineno - fn.lineno + 1,
                                _raises(fn), doc, src))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node, "", True)
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    add(m, f"{node.name}.", False)
    return out


def _tests(rel: str, text: str) -> dict[str, tuple[str, frozenset[str]]]:
    mod = rel[:-3].replace("/", ".")
    lines = text.splitlines(keepends=True)
    out = {}
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for m in node.body:
            if isinstance(m, ast.FunctionDef) and m.name.startswith("test"):
                names = {n.id for n in ast.walk(m) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(m) if isinstance(n, ast.Attribute)}
                out[f"{mod}.{node.name}.{m.name}"] = (_segment(lines, m), frozenset(names))
    return out


@lru_cache(maxsize=4)
def build_facts(pinned_key: str, seed: int) -> LedgerFacts:
    """Facts from the pinned files (key = JSON of the pinned map); owners seeded by `seed`."""
    import json

    files = load_pinned(json.loads(pinned_key))
    facts = LedgerFacts()
    for rel, text in sorted(files.items()):
        if rel.startswith("test/"):
            facts.tests.update(_tests(rel, text))
        else:
            module = rel[:-3].replace("/", ".").removesuffix(".__init__")
            for f in _functions(module, text):
                facts.functions[f.qualname] = f
    rng = random.Random(seed)
    for module in sorted({f.module for f in facts.functions.values()}):
        facts.owners[module] = rng.choice(OWNERS)
    return facts
