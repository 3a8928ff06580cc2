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
from tests.conftest import ROOT, run_cli
from tests.payloads import Tiny

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
