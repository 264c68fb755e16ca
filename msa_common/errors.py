"""The base error of msa-eval: each message is one line that names the fix."""


class MsaEvalError(Exception):
    """Base class of every error the CLI turns into one clear line and a non-zero exit."""
