"""Native code that crashes takes a worker process down, not the caller (``runtime/worker.py``): a backend that
asks for it (``Backend.fenced``) is opened and run in a worker, and its death is a ``RunnerCrashed`` naming the
signal, what the worker was doing and its last output (Python's faulthandler stack among it)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from infopt.runtime import backend as backend_registry
from infopt.runtime import backends
from infopt.runtime.worker import RunnerCrashed, WorkerRunner, describe_exit
from infopt.validators import timing
from tests.support import crashing_runners

FEED = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}


def toy_backend(monkeypatch, opener, fenced=True):
    toy = backend_registry.Backend(name="toy-native", representation="onnx", suffix=".native", runner_kind="crashing",
                                   open_runner=opener, fenced=lambda device: fenced)
    monkeypatch.setitem(backend_registry.BACKENDS.items, "toy-native", toy)
    return toy


def opened(monkeypatch, tmp_path, opener, fenced=True):
    toy_backend(monkeypatch, opener, fenced)
    (tmp_path / "m.native").write_text("")
    return backends.runner_for_file(tmp_path / "m.native", ["x"], fenced=True)


def test_a_fenced_runner_runs_in_a_worker_and_answers_as_in_process(monkeypatch, tmp_path):
    runner = opened(monkeypatch, tmp_path, crashing_runners.doubling)
    assert isinstance(runner, WorkerRunner) and runner.description.endswith("in a worker process")
    np.testing.assert_array_equal(runner.run(FEED)[0], FEED["x"] * 2)
    found = timing.measure({"w": runner.run}, {2: FEED}, warmup=1, iterations=4, blocks=2,
                           clocks=timing.worker_clocks(w=runner))
    assert found.stats[0].p50_ms > 0 and found.stats[0].iterations >= 4
    runner.close()
    in_process = opened(monkeypatch, tmp_path, crashing_runners.doubling, fenced=False)
    assert not isinstance(in_process, WorkerRunner)  # a backend that does not ask stays in process


@pytest.mark.parametrize("opener, doing, signal_words", [
    (crashing_runners.segfault_on_run, "running m.native", "SIGSEGV (a segmentation fault in native code)"),
    (crashing_runners.killed_on_run, "running m.native", "SIGKILL (killed: the kernel's OOM killer"),
], ids=["segfault", "oom-killed"])
def test_a_worker_killed_by_a_signal_is_a_crash_that_names_it(monkeypatch, tmp_path, opener, doing, signal_words):
    runner = opened(monkeypatch, tmp_path, opener)
    with pytest.raises(RunnerCrashed) as caught:
        runner.run(FEED)
    message = str(caught.value)
    assert message.startswith(f"the process {doing} ended with {signal_words}")
    if opener is crashing_runners.segfault_on_run:  # Python's own stack of where it died
        assert "Fatal Python error: Segmentation fault" in message and "crashing_runners.py" in message
    with pytest.raises(RunnerCrashed, match="ended with SIG"):  # and it stays dead, saying so again
        runner.run(FEED)


def test_a_worker_that_aborts_while_loading_fails_the_open(monkeypatch, tmp_path):
    with pytest.raises(RunnerCrashed, match=r"^the process loading m.native ended with SIGABRT \(native code called abort"):
        opened(monkeypatch, tmp_path, crashing_runners.abort_on_load)


def test_memory_past_the_workers_limit_is_an_error_of_the_run_not_a_crash(monkeypatch, tmp_path):
    runner = opened(monkeypatch, tmp_path, crashing_runners.out_of_memory_on_run)
    for _ in range(2):  # the worker lives on after an error it could raise
        with pytest.raises(RuntimeError, match="^MemoryError") as caught:
            runner.run(FEED)
        assert not isinstance(caught.value, RunnerCrashed)


def test_a_worker_past_its_memory_cap_is_stopped_before_the_oom_killer_and_says_what_it_held(monkeypatch, tmp_path):
    monkeypatch.setenv("INFOPT_WORKER_MEMORY", "400M")
    runner = opened(monkeypatch, tmp_path, crashing_runners.growing_on_run)
    with open(f"/proc/{runner._process.pid}/oom_score_adj") as f:
        assert int(f.read()) == 800  # the kernel takes the worker first, should the watch be too slow
    with pytest.raises(RunnerCrashed) as caught:
        runner.run(FEED)
    message = str(caught.value)
    assert re.match(r"the process running m.native was stopped for memory: it held 0\.[45] GB, past "
                    r"INFOPT_WORKER_MEMORY=400M \(0\.4 GB\); infopt stopped it before the kernel's OOM killer", message)
    assert runner.dead and runner._watch.peak < 400 * 2**20 + 4 * 2**26  # stopped within a few steps of the cap


def test_a_memory_cap_that_is_not_an_amount_is_a_usage_error(monkeypatch):
    from infopt.core.errors import UsageError
    from infopt.runtime.worker import memory_cap

    monkeypatch.setenv("INFOPT_WORKER_MEMORY", "lots")
    with pytest.raises(UsageError, match="INFOPT_WORKER_MEMORY='lots' is not an amount of memory"):
        memory_cap()
    monkeypatch.setenv("INFOPT_WORKER_MEMORY", "1.5G")
    assert memory_cap() == int(1.5 * 2**30)


def test_exit_codes_in_words():
    assert describe_exit(-11) == "SIGSEGV (a segmentation fault in native code)"
    assert describe_exit(-6).startswith("SIGABRT")
    assert describe_exit(3) == "exit 3" and describe_exit(-99) == "signal 99"


def test_the_bundled_backends_fence_what_can_crash():
    assert backends.named("inductor").fenced("cpu") and backends.named("inductor").fenced("cuda")
    assert backends.named("tensorrt").fenced("cuda")
    assert not backends.named("onnxruntime").fenced("cpu") and backends.named("onnxruntime").fenced("cuda")


def test_a_descriptor_whose_opener_is_a_lambda_is_found_by_suffix_in_the_worker(monkeypatch, tmp_path):
    """The worker cannot import a lambda by name: it opens the file by its suffix there, where the backend must
    be registered too (the bundled ones are)."""
    real = backends.named("onnxruntime")
    monkeypatch.setitem(backend_registry.BACKENDS.items, "onnxruntime",
                        replace(real, open_runner=lambda *a, **k: real.open_runner(*a, **k), fenced=lambda d: True))
    import torch

    path = tmp_path / "m.onnx"
    torch.onnx.export(torch.nn.Linear(3, 2), (torch.ones(1, 3),), str(path), input_names=["x"], output_names=["y"],
                      dynamo=False)
    runner = backends.runner_for_file(path, ["x"], ["y"], fenced=True)
    assert isinstance(runner, WorkerRunner)
    assert runner.run({"x": np.ones((1, 3), np.float32)})[0].shape == (1, 2)
