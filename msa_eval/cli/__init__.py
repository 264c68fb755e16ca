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


def main() -> None:
    """Console entry point: harness errors become one red line and exit code 1."""
    from engine.errors import EngineError
    from msa_eval.errors import MsaEvalError

    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (MsaEvalError, EngineError) as e:
        from msa_eval.display import error_line

        error_line(str(e))
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
