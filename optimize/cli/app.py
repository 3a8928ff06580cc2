"""The root of the ``infopt`` command: wires the commands and turns errors into exit codes.

Nothing heavy is imported here; each command imports what it needs when it runs, so
``infopt --help`` answers at once.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Optional

import typer

from infopt.cli.build import build
from infopt.cli.gate import gate
from infopt.cli.info import doctor, recipes, targets
from infopt.cli.inspect_model import inspect
from infopt.cli.validate import validate
from infopt.cli.verify import verify

app = typer.Typer(
    name="infopt",
    help="Turn a trained PyTorch model into a validated, deployable inference artifact.\n\n"
         "Exit codes: 0 ok, 1 validation or gate failed, 2 bad input, 3 build failed, 4 environment.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from infopt import __version__

        typer.echo(f"infopt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each step, and show tracebacks of unexpected errors.")] = False,
) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        import warnings

        warnings.filterwarnings("ignore")


app.command()(build)
app.command()(validate)
app.command()(verify)
app.command()(gate)
app.command()(inspect)
app.command()(targets)
app.command()(recipes)
app.command()(doctor)


def main() -> None:
    """Run the CLI; an ``InfoptError`` becomes its message and exit code, never a traceback."""
    from infopt.errors import InfoptError
    from infopt.threads import cap_torch_threads

    try:
        cap_torch_threads()
        app()
    except InfoptError as exc:
        _print_error(exc.title, exc.render())
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _print_error("interrupted", "stopped; no output folder was written")
        sys.exit(130)


def _print_error(title: str, message: str) -> None:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    console.print(f"[bold red]error[/] ({title}): ", end="")
    console.print(message, markup=False, highlight=False)
