"""The base errors of msa-eval: each message is one line that names the fix.

`HarnessError` and `EnvironmentFailure` are shared by the repository tasks (`tasks/repo`) and
the agent harness (`agents`, which knows the first as `AgentHarnessError`), so both forms of a
repository task raise and catch the same classes.
"""


class MsaEvalError(Exception):
    """Base class of every error the CLI turns into one clear line and a non-zero exit."""


class HarnessError(MsaEvalError):
    """The harness, not the model, failed (bad config, unknown task, a changed or missing source)."""


class EnvironmentFailure(HarnessError):
    """The task environment itself broke (workspace creation, git, test runner)."""
