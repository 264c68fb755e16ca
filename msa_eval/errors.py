"""Harness errors: each message is one line that names the fix. The base class is defined in
the bottom package (`msa_common.errors`) so that `agents` can subclass it; this is the same class."""
from msa_common.errors import MsaEvalError

__all__ = ["MsaEvalError"]
