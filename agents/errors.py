"""Typed errors of the agent harness.

`ToolError` is the model's mistake (a bad path, a missing argument): its message goes back to
the model as the tool result. Everything else is the harness's: typed, one line, the fix named.
"""
from __future__ import annotations

from msa_common.errors import MsaEvalError


class ToolError(Exception):
    """A tool call the model got wrong; the message is returned to the model."""


class ToolFormatError(ToolError):
    """A malformed call (unknown tool, missing or mistyped argument): counts as a format error."""


class AgentHarnessError(MsaEvalError):
    """The harness failed (bad config, unknown task, unreadable trajectory)."""


class EnvironmentFailure(AgentHarnessError):
    """The task environment itself broke (workspace creation, git, test runner)."""


class UnknownTaskError(AgentHarnessError):
    """A task id that is not in the suite."""


class RepoWithoutTestsError(AgentHarnessError):
    """A source repository with no test files, so nothing can verify a solution."""
