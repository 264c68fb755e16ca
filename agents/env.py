"""The environment an agent acts in: tools, checkpoint/restore (for resume) and grading.

Coding families use `WorkspaceEnvironment` (a repository copy plus the workspace tools);
family `ledger` brings its own in-process API. The loop only sees this interface.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.sandbox import Workspace
from agents.tools import WorkspaceTools


@dataclass
class Grade:
    score: float  # 1.0 = solved; partial credit lives in details
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return self.score >= 1.0


class Environment(ABC):
    @abstractmethod
    def tool_specs(self) -> list[dict[str, Any]]:
        """OpenAI tool schemas, `submit` included."""

    @abstractmethod
    def call(self, name: str, args: dict[str, Any]) -> str:
        """Execute one tool (never `submit`); raise ToolError for the model's mistakes."""

    @abstractmethod
    def checkpoint(self) -> dict[str, Any]:
        """JSON-ready state after a step (resume restores it)."""

    @abstractmethod
    def restore(self, state: dict[str, Any]) -> None: ...

    @abstractmethod
    def grade(self, answer: str | None) -> Grade:
        """Grade the current state and the submitted answer (None = never submitted)."""

    def close(self) -> None:  # noqa: B027 - optional hook: most environments hold nothing to release
        pass


class WorkspaceEnvironment(Environment):
    """A repository workspace; `grader(ws, answer)` is the family's verifier."""

    def __init__(self, ws: Workspace, run_tests: Callable[[str | None], str] | None,
                 grader: Callable[[Workspace, str | None], Grade], tool_names: list[str] | None = None,
                 command_timeout_s: float = 60.0):
        self.ws = ws
        self.tools = WorkspaceTools(ws, run_tests, tool_names, command_timeout_s)
        self._grader = grader

    def tool_specs(self) -> list[dict[str, Any]]:
        return self.tools.specs()

    def call(self, name: str, args: dict[str, Any]) -> str:
        return self.tools.call(name, args)

    def checkpoint(self) -> dict[str, Any]:
        return {"patch": self.ws.diff()}

    def restore(self, state: dict[str, Any]) -> None:
        self.ws.apply(state.get("patch", ""))

    def grade(self, answer: str | None) -> Grade:
        return self._grader(self.ws, answer)

    def close(self) -> None:
        self.ws.close()
