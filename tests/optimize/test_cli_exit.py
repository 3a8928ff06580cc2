"""How the ``infopt`` command ends: with the command's exit code, its output flushed and the exit
handlers run (temporary folders removed), without unloading every module; the ordinary exit where
another thread still works, so that thread's work is not cut off."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_end_runs_the_exit_handlers_flushes_and_keeps_the_exit_code(tmp_path):
    proc = _run("""
        import atexit, sys, tempfile
        from pathlib import Path
        from infopt.cli.app import _end
        left = tempfile.TemporaryDirectory(dir=".")  # removed by its finalizer, an exit handler
        atexit.register(lambda: Path("handler-ran").write_text("yes"))
        sys.stdout.write("result on stdout, not yet flushed")
        sys.stderr.write("a line on stderr")
        _end(3)
        """, tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "result on stdout, not yet flushed" and proc.stderr == "a line on stderr"
    assert (tmp_path / "handler-ran").read_text() == "yes"
    assert [p.name for p in tmp_path.iterdir()] == ["handler-ran"]  # the temporary folder is gone


def test_a_message_as_exit_code_is_printed_and_exits_1(tmp_path):
    proc = _run("from infopt.cli.app import _end; _end('stopped: no model')", tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip() == "stopped: no model"


def test_a_working_thread_is_waited_for(tmp_path):
    proc = _run("""
        import threading, time
        from pathlib import Path
        from infopt.cli.app import _end
        def work():
            time.sleep(0.3)
            Path("thread-done").write_text("yes")
        threading.Thread(target=work).start()
        _end(0)
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "thread-done").read_text() == "yes"


def test_the_command_and_python_m_use_it():
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["infopt"] == "infopt.cli.app:console"
    assert "console()" in (root / "optimize" / "cli" / "__main__.py").read_text()
