"""The task-family contract and the validation every generated task must pass.

A family generates `AgentTask`s deterministically from (seed, knobs, pinned source bytes),
builds the `Environment` a task runs in, and grades through that environment. `validate`
applies the gold actions directly through the environment's tools (gold must score 1) and
grades an untouched environment with an empty submission (must score 0); tasks failing
either are dropped by the generators.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from agents.env import Environment
from agents.task import AgentTask


class Family(ABC):
    name: ClassVar[str]  # the registered name: "regression", "needle", "rename", "ledger"
    version: ClassVar[str]
    description: ClassVar[str]

    @abstractmethod
    def generate(self, seed: int, n: int, *args: Any, **knobs: Any) -> list[AgentTask]:
        """`n` validated tasks, identical for identical (seed, knobs, source bytes); each family names its knobs."""

    @abstractmethod
    def environment(self, task: AgentTask, container: bool = False) -> Environment:
        """A fresh environment for `task` (the caller closes it)."""


def validate(family: Family, task: AgentTask) -> dict[str, float]:
    """{"gold": score after the gold actions, "empty": score of an empty submission}."""
    env = family.environment(task)
    try:
        answer = None
        for act in task.gold:
            if act["name"] == "submit":
                answer = str(act["arguments"].get("answer", ""))
                break
            if act["name"] != "run_tests":  # observation only; the grade runs the tests
                env.call(act["name"], act["arguments"])
        gold = env.grade(answer).score
    finally:
        env.close()
    env = family.environment(task)
    try:
        empty = env.grade("").score
    finally:
        env.close()
    return {"gold": gold, "empty": empty}
