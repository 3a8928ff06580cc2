"""Running ``infopt`` as a user does, for the tests: in a process of its own (:func:`run_cli`) or through the CLI's
entry point in this one (:func:`run_cli_here`), and what a clean failure looks like (:func:`assert_clean_failure`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""the checkout"""


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the installed ``infopt`` command as a user would (``env``: variables to set on top of ours)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "infopt.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def run_cli_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI's own entry point (``infopt.cli.app.main``) in this process, in ``cwd``: what a user's
    command runs, less the interpreter's start-up, for tables of failures that end in a second. An
    exception that escapes ``main`` is a traceback on stderr and exit 1, as it would be for the user."""
    import contextlib
    import io
    import signal
    import traceback
    import warnings

    from infopt.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    here, argv, on_term = os.getcwd(), sys.argv, signal.getsignal(signal.SIGTERM)
    os.chdir(cwd)
    sys.argv = ["infopt", *args]
    code = 0
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:  # noqa: BLE001 - what the user would see
                traceback.print_exc(file=err)
                code = 1
    finally:
        os.chdir(here)
        sys.argv = argv
        signal.signal(signal.SIGTERM, on_term)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def assert_clean_failure(proc, code: int, *needles: str, out=None):
    """``proc`` exited ``code`` with an error naming each of ``needles`` and no traceback, and left no ``out`` folder
    nor a staged sibling of it."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert "error" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    if out is not None:
        assert not out.exists()
        assert not out.parent.exists() or not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
