"""The `msa-eval` command: a thin click group. Each sub-command lives in its own module,
which exposes `register(group)`; rich rendering lives in `msa_eval.display`."""
from __future__ import annotations

import importlib
import sys

import click

from msa_eval import __version__

# One line per sub-command module (each module adds its commands to the group).
COMMAND_MODULES = [
    "msa_eval.cli.models",
    "msa_eval.cli.generate",
    "msa_eval.cli.serve",
    "msa_eval.cli.run",
    "msa_eval.cli.report",
    "msa_eval.cli.tasks",
    "msa_eval.cli.agent",
    "msa_eval.cli.sparsify",
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="msa-eval")
def cli() -> None:
    """Compare MSA, dense GQA and hosted endpoints on long-context work."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(cli)


def _harness_errors() -> tuple[type[BaseException], ...]:
    """The error types that become one line. EngineError counts only once the engine is
    loaded (importing it pulls in torch: seconds that `report` or `tasks` never need)."""
    from msa_eval.backends.base import BackendError
    from msa_eval.errors import MsaEvalError

    engine_errors = sys.modules.get("engine.errors")
    return (MsaEvalError, BackendError) + ((engine_errors.EngineError,) if engine_errors else ())


def main() -> None:
    """Console entry point: bad flags and harness errors become one red line on stderr and a
    non-zero exit (2), never a traceback; Ctrl-C exits 130."""
    from msa_eval.display import error_line

    try:
        code = cli.main(standalone_mode=False)  # returns ctx.exit's code (--help, --version: 0)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:  # click prints usage + hint + message: we print one line
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        error_line(e.format_message() + hint)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:
        if not isinstance(e, _harness_errors()):
            raise
        error_line(str(e))
        sys.exit(2)
    if isinstance(code, int) and code:
        sys.exit(code)
