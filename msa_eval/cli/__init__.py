"""The `msa-eval` command: a thin click group over the table of sub-commands. Each command lives
in its own module and is imported only when it runs (or `--help` lists it), so `msa-eval agent
list` loads the agent module and nothing else; rich rendering lives in `msa_eval.display`."""
from __future__ import annotations

import sys

import click

from msa_common.registry import Registry
from msa_eval import __version__

# name -> the click command (the registry idiom of `msa_common.registry`); `run` is the suite
# runner with `run agents` beside it (msa_eval.cli.agent.RunDispatch).
COMMANDS = Registry(
    table={
        "agent": "msa_eval.cli.agent:agent",
        "gate": "msa_eval.cli.gate:gate",
        "export": "msa_eval.cli.export:export",
        "export-tokenizer": "msa_eval.cli.export_tokenizer:export_tokenizer",
        "generate": "msa_eval.cli.generate:generate",
        "models": "msa_eval.cli.models:models",
        "report": "msa_eval.cli.report:report",
        "run": "msa_eval.cli.agent:run",
        "serve": "msa_eval.cli.serve:serve",
        "sparsify": "msa_eval.cli.sparsify:sparsify_cmd",
        "tasks": "msa_eval.cli.tasks:tasks",
    },
    unknown=lambda asked, names: click.UsageError(f"No such command {asked!r}."),
)


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS.names())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return COMMANDS.load(name) if name in COMMANDS else None  # None: click's own "No such command"


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="msa-eval")
def cli() -> None:
    """Compare MSA, dense GQA and hosted endpoints on long-context work."""


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
