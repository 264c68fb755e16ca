"""Name -> Task: one table of "module:Class" (the registry idiom of `msa_common.registry`).

`get_task(name)` imports only that task's module; `all_tasks()` imports them all (for listing
categories and fidelity). A new task is one line here; `tests/test_registry.py` fails if a
Task class is missing from the table or an entry names the wrong class.
"""
from __future__ import annotations

from msa_common.registry import Registry
from tasks.base import Task, TaskError

TASKS = Registry(
    table={
        "cite": "tasks.helmet.cite:CiteAnalogue",
        "cwe": "tasks.helmet.recall_ruler:CommonWords",
        "fwe": "tasks.helmet.recall_ruler:FrequentWords",
        "graphwalks": "tasks.helmet.graphwalks:GraphWalks",
        "helmet_json_kv_file": "tasks.loaders.files:HelmetJsonKVFile",
        "icl": "tasks.helmet.icl:ManyShotICL",
        "json_kv": "tasks.helmet.recall_kv:JsonKV",
        "longqa": "tasks.helmet.longqa:LongQA",
        "longbench_v2_file": "tasks.loaders.files:LongBenchV2File",
        "longqa_mc": "tasks.helmet.longqa:LongQAChoice",
        "mrcr": "tasks.helmet.mrcr:Mrcr",
        "mrcr_2": "tasks.helmet.mrcr:Mrcr2",
        "mrcr_4": "tasks.helmet.mrcr:Mrcr4",
        "mrcr_8": "tasks.helmet.mrcr:Mrcr8",
        "niah_mk2": "tasks.helmet.recall_niah:NiahMultiKey2",
        "niah_mk3": "tasks.helmet.recall_niah:NiahMultiKey3",
        "niah_mv": "tasks.helmet.recall_niah:NiahMultiValue",
        "niah_single": "tasks.helmet.recall_niah:NiahSingle",
        "niah_single_noise": "tasks.helmet.recall_niah:NiahSingleNoise",
        "rag": "tasks.helmet.rag:RagAnalogue",
        "repo_needle": "tasks.repo.needle:RepoNeedle",
        "repo_regression": "tasks.repo.regression:RepoRegression",
        "rerank": "tasks.helmet.rerank:RerankAnalogue",
        "ruler_file": "tasks.loaders.files:RulerFile",
        "summ": "tasks.helmet.summ:SummAnalogue",
        "vt": "tasks.helmet.recall_ruler:VariableTracking",
    },
    unknown=lambda asked, names: TaskError(f"unknown task {asked!r}; known tasks: {', '.join(names) or '(none)'}"),
)


def all_tasks() -> dict[str, type[Task]]:
    return {name: TASKS.load(name) for name in sorted(TASKS.names())}


def get_task(name: str) -> Task:
    """An instance of the task called `name`; unknown names raise with the list of known ones."""
    return TASKS.load(name)()
