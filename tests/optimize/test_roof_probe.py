"""The roof probe: once one candidate is built, the others are skipped where it already computes at this
machine's measured fp32 matmul peak (``candidates.roof_probe``), and the manifest and report say why."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import infopt
from infopt.api import candidates as cand
from infopt.core.inputspec import InputSpec
from infopt.core.recipe import load_recipe
from infopt.core.target import get_target
from infopt.runtime.backends.onnxruntime import OrtRunner

WIDTH, DEPTH, BATCH = 256, 3, 16
SPEC = InputSpec.parse([f"x:float32[batch,{WIDTH}]"], ["batch=1:16:32"])


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).eval()


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """An ONNX Runtime candidate of the MLP, built by hand: the real runner the probe times."""
    path = tmp_path_factory.mktemp("probe") / "mlp.onnx"
    torch.onnx.export(mlp(), (torch.randn(BATCH, WIDTH),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    c = cand.Candidate(load_recipe("fp32-onnxruntime"))
    c.runner, c.status = OrtRunner(path), "built"
    return c


def probe(first, peak_tflops: float, device: str = "cpu", built_in_s: float = 600.0):
    feed = {"x": np.random.default_rng(0).standard_normal((BATCH, WIDTH)).astype(np.float32)}
    target = get_target("cpu").model_copy(update={"peak_tflops": {"fp32": peak_tflops}, "device": device})
    return cand.roof_probe(first, feed, SPEC, mlp(), target, built_in_s)


def test_a_candidate_at_the_machines_peak_leaves_the_others_unbuilt_and_says_what_it_measured(first, monkeypatch):
    assert probe(first, peak_tflops=1e-6) is None  # the MLP runs in microseconds: overhead, not arithmetic
    monkeypatch.setattr(cand, "PROBE_MIN_RUN_S", 0.0)
    reason = probe(first, peak_tflops=1e-6)  # a machine that multiplies at 1 MFLOP/s: any model is at its roof
    assert reason.startswith("not built: fp32-onnxruntime already computes at")
    gflop = 2 * BATCH * DEPTH * WIDTH * WIDTH / 1e9  # FlopCounterMode's count of the three matmuls
    assert f"({gflop:.0f} GFLOP in " in reason and f"at batch {BATCH})" in reason
    assert reason.endswith("--recipe {recipe} builds it")  # each skipped candidate names its own recipe


def test_far_from_the_peak_or_not_this_cpu_or_not_fp32_or_a_quick_build_builds_every_candidate(first, monkeypatch):
    monkeypatch.setattr(cand, "PROBE_MIN_RUN_S", 0.0)
    assert probe(first, peak_tflops=1e6) is None  # a machine a million times faster: plenty to gain
    assert probe(first, peak_tflops=1e-6, built_in_s=cand.PROBE_AFTER_S / 2) is None  # the others build in seconds
    assert probe(first, peak_tflops=1e-6, device="cuda") is None  # the CPU's timing says nothing of a GPU
    int8 = cand.Candidate(load_recipe("int8-onnxruntime"))
    int8.runner = first.runner
    target = get_target("cpu").model_copy(update={"peak_tflops": {"fp32": 1e-6}})
    feed = {"x": np.ones((BATCH, WIDTH), np.float32)}
    assert cand.roof_probe(int8, feed, SPEC, mlp(), target, 600.0) is None  # the peak is fp32's


def test_a_share_past_the_peak_measures_the_kept_peak_again_and_keeps_the_new_one(first, tmp_path, monkeypatch):
    """A peak measured while something else ran is kept for a day: a share past 1 of it measures it again."""
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cand, "PROBE_MIN_RUN_S", 0.0)
    feed = {"x": np.random.default_rng(0).standard_normal((BATCH, WIDTH)).astype(np.float32)}
    declared = get_target("cpu").model_copy(update={"peak_tflops": {"fp32": 1e-6}})
    assert cand.roof_probe(first, feed, SPEC, mlp(), declared, 600.0).startswith("not built")  # a datasheet's figure
    assert not (tmp_path / "machine" / "roof.json").exists()
    measured = declared.model_copy(update={"measured": "measured on this machine while a build ran beside it"})
    cand.roof_probe(first, feed, SPEC, mlp(), measured, 600.0)
    kept = json.loads((tmp_path / "machine" / "roof.json").read_text())
    assert kept["peak"] > 1e-3  # measured again, and kept for the next build
    assert first.probe_share < 100  # of the new peak: of 1 MFLOP/s it would be 10,000 or more (6 MFLOP a run)


def test_a_build_skips_the_rest_once_the_first_is_at_the_roof_and_the_report_says_so(tmp_path, monkeypatch):
    for name in ("ROOF_SHARE", "PROBE_AFTER_S", "PROBE_MIN_RUN_S"):  # every first candidate is at the roof: the
        monkeypatch.setattr(cand, name, 0.0)                         # wiring is tested, not the timing
    result = infopt.build(mlp(), inputs=[f"x:float32[batch,{WIDTH}]"], dims=["batch=1:16:32"], batch_sizes=[1],
                          output=tmp_path / "mlp", progress=False)
    rows = {c["recipe"]: c for c in result.manifest.candidates}
    assert list(rows) == ["fp32-onnxruntime", "fp32-onnxruntime-fused", "fp32-inductor"]
    assert rows["fp32-onnxruntime"]["status"] == "built" and rows["fp32-onnxruntime"]["chosen"]
    for name in ("fp32-onnxruntime-fused", "fp32-inductor"):
        assert rows[name]["status"] == "skipped"
        assert rows[name]["reason"].startswith("not built: fp32-onnxruntime already computes at")
        assert rows[name]["reason"].endswith(f"--recipe {name} builds it")
    assert not (tmp_path / "mlp" / "model" / "model.pt2").exists()
    report = (tmp_path / "mlp" / "report.md").read_text()
    assert "fp32-inductor skipped: not built: fp32-onnxruntime already computes at" in report
    assert json.loads((tmp_path / "mlp" / "manifest.json").read_text())["recipe"]["name"] == "fp32-onnxruntime"


def test_the_probes_first_run_gives_the_drift_check_its_outputs_on_the_first_batch(first, monkeypatch):
    """The probe times the candidate on the first validation batch; the drift check takes that run's outputs rather
    than running the batch again (at BERT-large's batch 8 a run takes 3-4 s on 2 cores), and runs the others."""
    monkeypatch.setattr(cand, "PROBE_MIN_RUN_S", 0.0)
    rng = np.random.default_rng(1)
    batches = [{"x": rng.standard_normal((BATCH, WIDTH)).astype(np.float32)} for _ in range(3)]
    target = get_target("cpu").model_copy(update={"peak_tflops": {"fp32": 1e6}})
    ran = []
    real = first.runner.run
    monkeypatch.setattr(first.runner, "run", lambda feed: (ran.append(feed), real(feed))[1])
    assert cand.roof_probe(first, batches[0], SPEC, mlp(), target, 600.0) is None  # far from the roof: it ran anyway
    assert len(ran) == cand.PROBE_RUNS and first.probe_run is not None
    ran.clear()
    outputs = cand.validation_outputs(first, batches)
    assert [feed is b for feed, b in zip(ran, batches[1:])] == [True, True] and len(ran) == 2
    for got, batch in zip(outputs, batches):
        np.testing.assert_array_equal(got[0], real(batch)[0])
    assert first.probe_run is None  # taken once: a second check runs every batch
    ran.clear()
    cand.validation_outputs(first, batches)
    assert len(ran) == 3


def test_a_probe_that_finds_the_first_candidate_far_from_the_roof_says_so_and_every_candidate_builds(tmp_path, monkeypatch):
    monkeypatch.setattr(cand, "PROBE_AFTER_S", 0.0)
    monkeypatch.setattr(cand, "PROBE_MIN_RUN_S", 0.0)
    monkeypatch.setattr(cand, "ROOF_SHARE", 1e9)  # no machine computes past its peak a billion times over
    result = infopt.build(mlp(), inputs=[f"x:float32[batch,{WIDTH}]"], dims=["batch=1:16:32"], batch_sizes=[1],
                          output=tmp_path / "mlp", progress=False)
    rows = result.manifest.candidates
    assert rows[0]["status"] == "built" and not any((c.get("reason") or "").startswith("not built") for c in rows)
    (note,) = [n for n in result.manifest.validation.notes if "matmul peak on the first validation batch" in n]
    assert note.startswith("fp32-onnxruntime computed at ") and note.endswith("so they were built")
