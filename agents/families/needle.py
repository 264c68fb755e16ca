"""Family `needle` (B): needle-function retrieval (RepoQA "search needle function", generated offline).

Corpus: real pure-Python standard-library packages. A needle is a function or method with a
unique name, a body of 5-60 lines besides its docstring, and a docstring whose summary
(the description given to the model) contains none of the name's word parts. In the agentic
form the needle's docstring is deleted from the workspace and the agent must submit
`path::qualname`; the single-prompt form (`tasks/repo`) puts T tokens of this corpus in the
prompt with the needle at a chosen depth. Both are graded by the needle's identity.
"""
from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass
from typing import Any

from agents.env import Grade, WorkspaceEnvironment
from agents.families.base import Family, validate
from agents.families.common import materialize, open_workspace
from agents.sources import package_files, pin, stdlib_dir
from agents.task import AgentTask, short_hash

CORPUS = ("json", "email", "http", "html", "urllib")


@dataclass(frozen=True)
class Needle:
    path: str
    qualname: str
    name: str
    description: str
    start: int  # 1-based first line of the function (decorators excluded)
    end: int
    doc_start: int  # docstring lines (whole lines), removed in the agentic form
    doc_end: int


def corpus_files(packages: tuple[str, ...] = CORPUS) -> dict[str, Any]:
    lib = stdlib_dir()
    files: dict[str, Any] = {}
    for p in packages:
        if (lib / p).is_dir():
            files.update({k: v for k, v in package_files(lib / p, p).items() if k.endswith(".py")})
        else:
            files[f"{p}.py"] = lib / f"{p}.py"
    return pin(files)


def _words(name: str) -> set[str]:
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)
    return {w.lower() for w in parts if len(w) >= 4}


def summary(doc: str) -> str:
    return " ".join(doc.strip().split("\n\n")[0].split())


def find_needles(files: dict[str, str]) -> list[Needle]:
    found: list[Needle] = []
    counts: dict[str, int] = {}
    for rel, text in sorted(files.items()):
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node, qual in _defs(tree):
            counts[node.name] = counts.get(node.name, 0) + 1
            doc = ast.get_docstring(node)
            if not doc or len(node.body) < 2:
                continue
            d = node.body[0]
            desc = summary(doc)
            body_lines = node.end_lineno - d.end_lineno
            whole = lines[d.lineno - 1][:d.col_offset].strip() == "" and lines[d.end_lineno - 1][d.end_col_offset:].strip() == ""
            if not (5 <= body_lines <= 60 and 6 <= len(desc.split()) <= 80 and whole):
                continue
            if any(w in desc.lower() for w in _words(node.name)) or node.name in desc:
                continue
            found.append(Needle(rel, qual, node.name, desc, node.lineno, node.end_lineno, d.lineno, d.end_lineno))
    return [n for n in found if counts[n.name] == 1]


def _defs(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.name
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield m, f"{node.name}.{m.name}"


def strip_docstring(text: str, n: Needle) -> tuple[str, str]:
    """(old, new) edit deleting the needle's docstring lines (the old block is unique)."""
    lines = text.splitlines(keepends=True)
    old = "".join(lines[n.start - 1:n.doc_end])
    new = "".join(lines[n.start - 1:n.doc_start - 1])
    return old, new


def normalize_answer(answer: str | None) -> str:
    a = (answer or "").strip().strip("`'\" ").replace("\\", "/")
    a = re.sub(r"^\./", "", a)
    return re.sub(r"\s*::\s*", "::", a)


class NeedleFunction(Family):
    name, version = "needle", "1"
    description = "find the stdlib function matching a description (docstring removed); answer path::qualname"

    def generate(self, seed: int, n: int, packages: tuple[str, ...] = CORPUS) -> list[AgentTask]:
        pinned = corpus_files(tuple(packages))
        files = materialize({"files": pinned})
        needles = find_needles(files)
        random.Random(seed).shuffle(needles)
        tasks = []
        for nd in needles:
            if len(tasks) == n:
                break
            old, new = strip_docstring(files[nd.path], nd)
            if files[nd.path].count(old) != 1:
                continue
            answer = f"{nd.path}::{nd.qualname}"
            gold = [{"name": "search", "arguments": {"pattern": rf"def {nd.name}\("}},
                    {"name": "read_file", "arguments": {"path": nd.path, "start_line": nd.start,
                                                        "end_line": nd.end - (nd.doc_end - nd.doc_start + 1)}},
                    {"name": "submit", "arguments": {"answer": answer}}]
            spec = {"files": pinned, "setup": [{"path": nd.path, "old": old, "new": new}], "answer": answer,
                    "needle": nd.__dict__, "gold": gold}
            instr = (f"Somewhere in this repository ({', '.join(packages)} from the Python standard library) is a "
                     f"function or method whose docstring was removed. It does the following:\n\n  {nd.description}\n\n"
                     f"Find it and call submit with its location as `path::qualname`, for example "
                     f"`json/decoder.py::JSONDecoder.raw_decode`.")
            task = AgentTask(f"{self.name}-{nd.name}-{short_hash(seed, answer)}", self.name, self.version, seed, instr, spec,
                             {"max_steps": 40}, {"corpus_files": len(pinned), "needle": answer})
            if validate(self, task) == {"gold": 1.0, "empty": 0.0}:
                tasks.append(task)
        return tasks

    def environment(self, task: AgentTask, container: bool = False) -> WorkspaceEnvironment:
        ws = open_workspace(materialize(task.spec), container)
        want = task.spec["answer"]

        def grade(_ws, answer: str | None) -> Grade:
            got = normalize_answer(answer)
            return Grade(1.0 if got == want else 0.0, {"expected": want, "answer": got,
                                                       "name_only_match": got.split("::")[-1] == want.split("::")[-1]})

        return WorkspaceEnvironment(ws, None, grade, tool_names=["bash", "read_file", "search", "list_dir"])
