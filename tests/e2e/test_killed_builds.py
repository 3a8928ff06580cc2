"""Real builds from the command line, killed (SIGTERM and SIGKILL) at points spread over the whole
build while they replace an existing output with --force: the output is every time the old build or
the new one, whole, and the next command leaves no temporary sibling beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from infopt.core.manifest import read_manifest, verify_files
from infopt.exporters.staging import clean_stale
from tests.support.cli import ROOT, run_cli
from tests.support.payloads import Tiny

BUILD = ["build", "tiny.pt", "--input", "x:float32[batch,4]", "--backend", "onnxruntime", "--force", "-q"]


def _whole(dist) -> str:
    manifest = read_manifest(dist)
    assert verify_files(dist, manifest.files) == []
    return manifest.created


@pytest.mark.slow
def test_builds_killed_anywhere_leave_the_old_or_the_new_output_whole(tmp_path):
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(tmp_path / "tiny.pt"))
    start = time.perf_counter()
    first = run_cli(*BUILD, cwd=tmp_path)
    took = time.perf_counter() - start
    assert first.returncode == 0, first.stderr[-2000:]
    dist = tmp_path / "dist" / "tiny"
    outcomes = []
    for i, fraction in enumerate((0.3, 0.75, 0.97)):
        before = _whole(dist)
        proc = subprocess.Popen([sys.executable, "-m", "infopt.cli", *BUILD], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(took * fraction)
        sig = signal.SIGTERM if i % 2 == 0 else signal.SIGKILL
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err[-2000:]
        if sig == signal.SIGTERM and proc.returncode == 143:
            assert "stopped by SIGTERM" in err, err[-2000:]
        after = _whole(dist)  # old or new, never half
        outcomes.append("old" if after == before else "new")
        if i == 1:  # `infopt doctor` cleans what the killed build left, as the next build would (below)
            assert run_cli("doctor", cwd=tmp_path).returncode == 0
        else:
            clean_stale(tmp_path / "dist")
        assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == ["tiny"], (outcomes, err[-2000:])
    assert "old" in outcomes  # the kills did land before the swap


SIGTERM_WHILE_IMPORTING = """
import os, signal, sys, time
from infopt.cli.app import _on_sigterm

class NothingImports:
    def find_spec(self, name, path, target=None):
        raise ImportError(f"the SIGTERM handler imported {name}")

signal.signal(signal.SIGTERM, _on_sigterm())
for name in [m for m in sys.modules if m.split('.')[0] == 'rich']:
    del sys.modules[name]  # as if the signal landed before (or while) rich was imported
sys.meta_path.insert(0, NothingImports())
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
"""


def test_sigterm_landing_while_a_module_is_half_imported_still_stops_cleanly():
    """The signal can land in the middle of any import (seen: rich's console, half imported, then
    imported again by the handler, a traceback). The handler imports nothing: with every import refused,
    it still says what happened and exits 143."""
    proc = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_IMPORTING], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 143
    assert proc.stderr.startswith("error (interrupted): stopped by SIGTERM")


def _dead_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_work_folders_of_killed_builds_are_removed_by_the_next_build_and_by_doctor(tmp_path, monkeypatch):
    """A build killed with SIGKILL cannot remove its folders in $TMPDIR; the next build and ``infopt doctor``
    remove those whose process is gone, and leave a running process's and anything not infopt's."""
    import tempfile

    from tests.support.cli import run_cli_here

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(tmp_path / "tiny.pt"))

    def leave() -> list:
        pid = _dead_pid()
        folders = [tmp / f"infopt-build-{pid}-a1b2c3", tmp / f"infopt-calib-{pid}-x_y"]
        for folder in folders:
            folder.mkdir()
            (folder / "model.onnx").write_bytes(b"0" * 1024)
        return folders

    running = tmp / f"infopt-build-{os.getppid()}-live"  # the test runner's parent runs
    running.mkdir()
    theirs = tmp / "infopt-something-else"
    theirs.mkdir()
    left = leave()
    proc = run_cli("doctor", "--clean", "dist", cwd=tmp_path, env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any(f.exists() for f in left) and running.is_dir() and theirs.is_dir()
    assert proc.stdout.count("left by a build that was killed") == 2

    left = leave()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    proc = run_cli_here(*BUILD, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any(f.exists() for f in left) and running.is_dir() and theirs.is_dir()
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("infopt-")) == sorted([running.name, theirs.name])
