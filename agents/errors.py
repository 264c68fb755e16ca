"""Typed errors of the agent harness.

`ToolError` is the model's mistake (a bad path, a missing argument): its message goes back to
the model as the tool result. Everything else is the harness's: typed, one line, the fix named.
`AgentHarnessError` is `msa_common.errors.HarnessError` under its agent name, and
`EnvironmentFailure` / `RepoWithoutTestsError` come from below too, because the repository
fixtures (`tasks/repo`) that both task forms share raise them.
"""
from __future__ import annotations

from msa_common.errors import EnvironmentFailure
from msa_common.errors import HarnessError as AgentHarnessError
from tasks.repo.sources import RepoWithoutTestsError

__all__ = ["AgentHarnessError", "EnvironmentFailure", "RepoWithoutTestsError", "ToolError", "ToolFormatError",
           "UnknownTaskError"]


class ToolError(Exception):
    """A tool call the model got wrong; the message is returned to the model."""


class ToolFormatError(ToolError):
    """A malformed call (unknown tool, missing or mistyped argument): counts as a format error."""


class UnknownTaskError(AgentHarnessError):
    """A task id that is not in the suite."""
