"""The root of the ``infopt`` command: wires the commands and turns errors into exit codes.

Nothing heavy is imported here; each command imports what it needs when it runs, so
``infopt --help`` answers at once.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated, Optional

import typer

from infopt.cli.build import build
from infopt.cli.gate import gate
from infopt.cli.info import doctor, recipes, targets
from infopt.cli.inspect_model import inspect
from infopt.cli.serve import serve
from infopt.cli.sweep import sweep
from infopt.cli.validate import validate
from infopt.cli.verify import sign, verify

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
        from infopt.core.version import __version__

        typer.echo(f"infopt {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    metavar="", help="Print the version and exit.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", metavar="", help="Log each step, and show tracebacks of unexpected errors.")] = False,
) -> None:
    _log_to_stderr(verbose)


def _log_to_stderr(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        import warnings

        warnings.filterwarnings("ignore")
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Loading weights" bar


def _plugin_flags(argv: list[str]) -> None:
    """Before ``infopt build`` reads its options: where a package declares an ``infopt.plugins`` entry point, fill
    the registries, which loads the plugins, so that the settings their passes declare (``new_setting``) are
    options of the command and its --help lists them. Only for ``build``, and only then: filling them imports
    torch, which ``infopt --help`` and the other commands do without."""
    from infopt.core import plugin_loader

    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    if command != "build" or not plugin_loader.declared():
        return
    _log_to_stderr(any(arg in ("-v", "--verbose") for arg in argv[1:argv.index(command)]))
    import infopt.api.registries  # noqa: F401 - loads the plugins after the bundled entries
    from infopt.cli.build import with_plugin_settings

    with_plugin_settings()


NOISY_LOGGERS = (
    "torchao",  # "Failed to load ..._C_mxfp8.so / _C_cutlass_90a.so": CUDA kernels a CPU build cannot load
    "torch.utils._pytree",  # torchao registering Enum constants: "register_constant() ... is deprecated"
)
"""Loggers whose warnings a user cannot act on; shown with -v."""


INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C (SIGINT)."""
TERMINATED = 143
"""The exit code of a command stopped by SIGTERM (128 + 15)."""


app.command()(build)
app.command()(validate)
app.command()(verify)
app.command()(sign)
app.command()(gate)
app.command()(sweep)
app.command()(inspect)
app.command()(targets)
app.command()(recipes)
app.command()(doctor)
app.command()(serve)


def main() -> None:
    """Run the CLI; an ``InfoptError`` or a usage error becomes its message and exit code, never a
    traceback. SIGTERM removes what this process staged and exits 143 (``TERMINATED``) at once (see ``_on_sigterm``)."""
    import signal

    from infopt.core.errors import InfoptError
    from infopt.core.threads import cap_torch_threads

    signal.signal(signal.SIGTERM, _on_sigterm())
    try:
        cap_torch_threads()
        _plugin_flags(sys.argv)
        code = app(standalone_mode=False)
    except InfoptError as exc:
        _print_error(exc.title, exc.render())
        _json_error(exc, exc.exit_code)
        sys.exit(exc.exit_code)
    except _usage_errors() as exc:
        _json_error(_print_usage_error(exc), 2)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        code = INTERRUPTED
    if code == INTERRUPTED:
        _print_error("interrupted", STOPPED)
        _json_error(InfoptError(STOPPED), INTERRUPTED, kind="interrupted")
    sys.exit(code if isinstance(code, int) else 0)


def console() -> None:
    """The ``infopt`` command (and ``python -m infopt.cli``): :func:`main`, then a prompt end.

    Once the command has finished, the exit handlers have run (temporary folders, log handlers) and
    stdout and stderr are flushed, the process ends there rather than unloading torch, ONNX Runtime
    and transformers module by module, which takes over a second and writes nothing. Where another
    (non-daemon) thread still runs, the exit is the ordinary one, which waits for it."""
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    _end(code)


def _end(code: object) -> None:
    import atexit
    import threading

    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    status = 0 if code is None else int(code)  # type: ignore[arg-type]
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None or any(t is not threading.main_thread() and t.is_alive() and not t.daemon
                                        for t in threading.enumerate()):
        sys.exit(status)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
            pass
    os._exit(status)


def _json_error(exc, code: int, kind: str | None = None) -> None:
    """With ``--json``, an error is also one JSON object on stdout, so a script reads it like a result:
    ``passed`` (false), ``error``, ``kind``, ``where``, ``fix``, ``exit_code``."""
    if "--json" not in sys.argv[1:]:
        return
    import json

    print(json.dumps({"passed": False, "error": exc.what, "kind": kind or exc.title, "where": exc.where,
                      "fix": exc.fix, "exit_code": code}, indent=2))


STOPPED = "stopped; an output folder is only ever replaced whole, so it is as it was before this build (or as the build left it if it had finished)"


def _on_sigterm():
    """The SIGTERM handler: remove what this process staged, say so, exit 143 at once. Raising instead
    would not always stop: an exception raised while a finalizer or weakref callback runs is printed and
    dropped by Python, and the build would go on. The handler imports nothing and writes plain bytes: the
    signal can land while any module (rich's console, say) is half imported, and importing it again
    from the handler would fail with a traceback."""
    import os

    from infopt.exporters.staging import stop_now

    message = f"error (interrupted): {STOPPED.replace('stopped', 'stopped by SIGTERM', 1)}\n".encode()

    def terminated(signum, frame) -> None:
        stop_now()
        os.write(2, message)
        os._exit(TERMINATED)

    return terminated


def _usage_errors() -> tuple[type[Exception], ...]:
    """click's UsageError: typer's own copy of click (typer >= 0.24 vendors it) and click itself."""
    import importlib

    found = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).UsageError)
        except ImportError:
            continue
    return tuple(found)


NEAR_MISSES = {
    ("gate", "--markdown"): "the gate writes its Markdown with --summary FILE (--junit FILE for CI test reports); ",
    ("gate", "--md"): "the gate writes its Markdown with --summary FILE; ",
    ("build", "--markdown"): "a build always writes report.md (and report.html) into its output folder; ",
}
"""(command, option a user guesses) -> what to use instead, put before the usual fix."""


def _print_usage_error(exc):
    """click's usage errors in infopt's form: what was wrong, where (the command), what to do; returns it
    as an ``InfoptError``."""
    from infopt.core.errors import UsageError

    command = exc.ctx.command_path if exc.ctx is not None else "infopt"
    what = exc.format_message().strip().rstrip(".")
    hint = next((h for (cmd, option), h in NEAR_MISSES.items() if command.endswith(cmd) and f"option: {option}" in what), "")
    error = UsageError(what, where=command, fix=hint + f"run `{command} --help` for its arguments and options")
    _print_error("usage", error.render())
    return error


def _print_error(title: str, message: str) -> None:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True)
    console.print(f"[bold red]error[/] ({title}): ", end="")
    console.print(message, markup=False, highlight=False)
