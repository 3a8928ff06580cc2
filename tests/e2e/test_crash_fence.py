"""A candidate whose native code crashes never takes the build down (``runtime/worker.py``): the AOTInductor
backend's runner runs in a worker process, and here its ``open_runner`` is replaced by one whose run reads address
0 (``tests/support/crashing_runners.py``), as a package that segfaults when loaded or run does. The build, ``validate``
and ``gate`` run from the CLI as a user runs them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

import infopt
from infopt.runtime import backend as backend_registry
from infopt.runtime import backends
from infopt.runtime.worker import RunnerCrashed, WorkerRunner
from tests.support import crashing_runners
from tests.support.cli import run_cli_here

pytestmark = pytest.mark.slow
CNN = ["--input", "x:float32[batch,1,8,8]", "--dim", "batch=1:4:8"]


def crash_inductor(monkeypatch, opener=crashing_runners.segfault_on_run):
    real = backends.named("inductor")
    monkeypatch.setitem(backend_registry.BACKENDS.items, "inductor", replace(real, open_runner=opener))


def test_a_crashing_candidate_fails_with_its_signal_and_the_build_validate_and_gate_go_on(files, tmp_path, monkeypatch):
    model, val = str(files / "cnn_ts.pt"), str(files / "digits_val.npz")
    good = run_cli_here("build", model, *CNN, "--val", val, "--backend", "inductor", "-o", "aoti", cwd=tmp_path)
    assert good.returncode == 0, good.stderr  # the real package, validated and timed in its worker
    manifest = json.loads((tmp_path / "aoti" / "manifest.json").read_text())
    assert manifest["candidates"][0]["runs_on"].endswith("in a worker process")
    x = {"x": np.load(files / "digits_val.npz")["x"][:4]}
    isolated = infopt.load(tmp_path / "aoti", isolated=True)  # the Python API runs in process unless asked
    assert isinstance(isolated, WorkerRunner) and not isinstance(infopt.load(tmp_path / "aoti"), WorkerRunner)
    np.testing.assert_allclose(isolated.run(x)[0], infopt.load(tmp_path / "aoti").run(x)[0], rtol=1e-5, atol=1e-6)

    crash_inductor(monkeypatch)
    with pytest.raises(RunnerCrashed, match="ended with SIGSEGV"):
        infopt.load(tmp_path / "aoti", isolated=True).run(x)
    auto = run_cli_here("build", model, *CNN, "--val", val, "-o", "auto", cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    rows = {c["recipe"]: c for c in json.loads((tmp_path / "auto" / "manifest.json").read_text())["candidates"]}
    crashed = rows["fp32-inductor"]
    assert crashed["status"] == "failed"
    assert crashed["reason"].startswith("crashed: the process running model.pt2 ended with SIGSEGV (a segmentation "
                                        "fault in native code)")
    assert "Fatal Python error: Segmentation fault" in crashed["reason"]  # the worker's faulthandler stack
    assert any(c["chosen"] and c["recipe"].startswith("fp32-onnxruntime") for c in rows.values())
    assert "SIGSEGV" in (tmp_path / "auto" / "report.md").read_text()

    alone = run_cli_here("build", model, *CNN, "--val", val, "--backend", "inductor", "-o", "alone", cwd=tmp_path)
    assert alone.returncode == 3 and "SIGSEGV" in alone.stderr and "Traceback" not in alone.stderr
    assert not (tmp_path / "alone").exists()  # nothing half-written

    checked = run_cli_here("validate", "aoti", cwd=tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "FAIL: the model crashed: the process running model.pt2 ended with SIGSEGV" in checked.stdout

    crash_inductor(monkeypatch, crashing_runners.segfault_at_batch_3)  # passes validation, dies while timed
    late = run_cli_here("build", model, *CNN, "--val", val, "--batch-sizes", "3", "-o", "late", cwd=tmp_path)
    assert late.returncode == 0, late.stderr
    rows = {c["recipe"]: c for c in json.loads((tmp_path / "late" / "manifest.json").read_text())["candidates"]}
    assert rows["fp32-inductor"]["status"] == "failed"
    assert rows["fp32-inductor"]["reason"].startswith("crashed: the process timing model.pt2 ended with SIGSEGV")
    assert rows["fp32-onnxruntime"]["status"] == "built" and rows["fp32-onnxruntime"]["chosen"]

    crash_inductor(monkeypatch)
    gated = run_cli_here("gate", "aoti", "--baseline", "auto", "--json", cwd=tmp_path)
    assert gated.returncode == 1, gated.stdout + gated.stderr
    checks = json.loads(gated.stdout)["checks"]
    crash = next(c for c in checks if c["group"] == "runtime")
    assert crash["passed"] is False and "SIGSEGV" in crash["detail"]


def test_a_candidate_past_the_memory_cap_is_stopped_and_the_build_ships_another(files, tmp_path, monkeypatch):
    """``INFOPT_WORKER_MEMORY`` caps a worker (the machine's available memory does without it): a runner that takes
    memory without end is stopped at the cap, its candidate fails saying so, and the build ships the other."""
    crash_inductor(monkeypatch, crashing_runners.growing_on_run)
    monkeypatch.setenv("INFOPT_WORKER_MEMORY", "1G")
    model, val = str(files / "cnn_ts.pt"), str(files / "digits_val.npz")
    auto = run_cli_here("build", model, *CNN, "--val", val, "-o", "auto", cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    rows = {c["recipe"]: c for c in json.loads((tmp_path / "auto" / "manifest.json").read_text())["candidates"]}
    assert rows["fp32-inductor"]["status"] == "failed"
    assert re.match(r"out of memory: the process running model.pt2 was stopped for memory: it held 1\.[1-3] GB, past "
                    r"INFOPT_WORKER_MEMORY=1G \(1\.1 GB\)", rows["fp32-inductor"]["reason"])
    assert any(c["chosen"] and c["recipe"].startswith("fp32-onnxruntime") for c in rows.values())
