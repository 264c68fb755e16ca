"""Family `needle` (B): needle-function retrieval (RepoQA "search needle function", generated offline).

Corpus and needles: `tasks/repo/corpus.py` (real pure-Python standard-library packages;
functions with a unique name and a docstring that does not give the name away). In the agentic
form the needle's docstring is deleted from the workspace and the agent must submit
`path::qualname`; the single-prompt form (`tasks/repo`) puts T tokens of this corpus in the
prompt with the needle at a chosen depth. Both are graded by the needle's identity.
"""
from __future__ import annotations

import random
import re

from agents.env import Grade, WorkspaceEnvironment
from agents.families.base import Family, validate
from agents.families.common import open_workspace
from agents.task import AgentTask
from tasks.repo.corpus import CORPUS, corpus_files, find_needles, strip_docstring
from tasks.repo.fixtures import materialize, short_hash


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
        tasks: list[AgentTask] = []
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
            task = AgentTask(f"{self.name}-{nd.name}-{short_hash(seed, answer)}", self.name, self.version, seed, instr,
                             spec, {"max_steps": 40}, {"corpus_files": len(pinned), "needle": answer})
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
