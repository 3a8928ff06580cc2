"""The TensorRT build pass: the server fallback here, a real engine where TensorRT and a GPU are."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from infopt.core.errors import EnvironmentProblem, RecipeError
from infopt.core.pass_api import PassContext
from infopt.core.target import get_target
from infopt.passes.lower import tensorrt_build
from infopt.passes.lower.tensorrt_build import PASS, tensorrt_unavailable
from infopt.runtime.backends.onnxruntime import OrtRunner
from infopt.validators.metrics import max_abs
from tests.support.passes import capture, run_pass

UNAVAILABLE = tensorrt_unavailable()


def needs_tensorrt(test):
    """Marked tensorrt and gpu; skipped unless tensorrt imports and torch sees a CUDA GPU."""
    skip = pytest.mark.skipif(UNAVAILABLE is not None,
                              reason=f"building a TensorRT engine needs tensorrt and a CUDA GPU: {UNAVAILABLE}")
    return pytest.mark.tensorrt(pytest.mark.gpu(skip(test)))


class SmallConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


@pytest.fixture
def conv_onnx(tmp_path):
    torch.manual_seed(0)
    art = capture(SmallConv(), "x:float32[batch,3,16,16]", ["batch=1:4:8"])
    out = run_pass("onnx_export", art, tmp_path)
    onnx.checker.check_model(str(out.artifact.path), full_check=True)
    return out.artifact


def build(artifact, tmp_path, target="cpu", **options):
    workdir = tmp_path / "trt"
    workdir.mkdir(exist_ok=True)
    return PASS.run(artifact, PASS.parse_options(options), PassContext(get_target(target), workdir))


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def no_tensorrt(monkeypatch):
    """Behave as on a machine without TensorRT, whatever this one has."""
    monkeypatch.setattr(tensorrt_build, "tensorrt_unavailable", lambda: "the tensorrt package is not installed")


def test_options_are_typed_and_bounded():
    opts = PASS.parse_options({})
    assert (opts.precision, opts.workspace_gb, opts.optimization_level) == ("fp32", 4.0, 3)
    assert opts.timing_cache is True and opts.when_missing == "server"
    with pytest.raises(RecipeError, match="optimization_level"):
        PASS.parse_options({"optimization_level": 6})
    with pytest.raises(RecipeError, match="precision"):
        PASS.parse_options({"precision": "int4"})
    assert (PASS.consumes, PASS.produces) == ("onnx", "tensorrt")


@pytest.mark.skipif(UNAVAILABLE is None, reason="this machine has TensorRT and a GPU, so the pass builds an engine")
def test_reason_names_what_is_missing_here():
    assert UNAVAILABLE in ("the tensorrt package is not installed", "no CUDA GPU on this machine") \
        or UNAVAILABLE.startswith("the tensorrt package cannot load")


@pytest.mark.parametrize("precision, mode", [("fp32", "FP32"), ("fp16", "FP16"), ("int8", "INT8")])
def test_server_mode_keeps_the_onnx_model(conv_onnx, tmp_path, no_tensorrt, precision, mode):
    before = sha(conv_onnx.path)
    out = build(conv_onnx, tmp_path, target="h100", precision=precision, workspace_gb=2.0)
    assert out.artifact is conv_onnx and out.artifact.kind == "onnx"
    assert out.artifact.path == conv_onnx.path and sha(out.artifact.path) == before
    assert out.changed is False
    assert out.details.model_dump(exclude_none=True) == {
        "engine": "server", "precision": precision, "precision_mode": mode, "reason": "the tensorrt package is not installed",
        "workspace_gb": 2.0, "profile": {}}
    (note,) = out.notes
    assert "the tensorrt package is not installed" in note and f"precision {mode}" in note
    assert not list((tmp_path / "trt").iterdir())
    x = np.random.default_rng(0).standard_normal((3, 3, 16, 16), dtype=np.float32)
    assert OrtRunner(out.artifact.path).run({"x": x})[0].shape == (3, 4)


@pytest.mark.skipif(UNAVAILABLE is None, reason="this machine has TensorRT and a GPU, so the pass builds an engine")
def test_server_mode_with_the_real_reason(conv_onnx, tmp_path):
    out = build(conv_onnx, tmp_path)
    assert out.details.engine == "server" and out.details.reason == UNAVAILABLE
    assert UNAVAILABLE in out.notes[0]


@pytest.mark.skipif(UNAVAILABLE is None, reason="this machine has TensorRT and a GPU, so the runner loads engines")
def test_runner_without_tensorrt_is_an_environment_problem(tmp_path):
    from infopt.runtime.backends.tensorrt import TensorRTRunner

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"engine")
    with pytest.raises(EnvironmentProblem) as caught:
        TensorRTRunner(plan)
    assert caught.value.exit_code == 4 and UNAVAILABLE in caught.value.what
    assert "pip install tensorrt" in caught.value.fix


def test_error_mode_is_an_environment_problem(conv_onnx, tmp_path, no_tensorrt):
    with pytest.raises(EnvironmentProblem) as caught:
        build(conv_onnx, tmp_path, when_missing="error")
    assert caught.value.exit_code == 4
    assert "the tensorrt package is not installed" in caught.value.what
    assert "pip install tensorrt" in caught.value.fix and "--backend tensorrt" in caught.value.fix


def test_engine_artifact_reports_the_onnx_models_outputs(conv_onnx, tmp_path):
    """The manifest's outputs of a built engine come from the ONNX model it was built from."""
    from infopt.api.candidates import artifact_outputs
    from infopt.api.emit import onnx_outputs

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"engine")
    engine = tensorrt_build.engine_artifact(conv_onnx, plan)
    assert engine.kind == "tensorrt" and engine.path == plan and engine.spec == conv_onnx.spec
    expected = onnx_outputs(conv_onnx.path)
    assert [(dtype, shape) for _, dtype, shape in expected] == [("float32", ("batch", 4))]
    assert artifact_outputs(engine) == expected


@pytest.mark.parametrize("precision", ["fp8", "bf16"])
def test_fp8_and_bf16_cannot_be_left_to_the_server(conv_onnx, tmp_path, no_tensorrt, precision):
    with pytest.raises(EnvironmentProblem) as caught:
        build(conv_onnx, tmp_path, precision=precision)
    assert caught.value.exit_code == 4
    assert precision in caught.value.what and "built where TensorRT and a GPU are present" in caught.value.what
    assert "--fp16" in caught.value.fix


@needs_tensorrt
def test_fp16_engine_matches_onnx_runtime_at_two_batch_sizes(conv_onnx, tmp_path, monkeypatch):
    from infopt.runtime.backends.tensorrt import TensorRTRunner

    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    out = build(conv_onnx, tmp_path, target="h100", precision="fp16", optimization_level=1)
    assert out.changed and out.artifact.kind == "tensorrt" and out.artifact.path.name == "model.plan"
    assert out.details.engine == "built" and out.details.precision == "fp16"
    assert out.details.profile == {"x": {"min": [1, 3, 16, 16], "opt": [4, 3, 16, 16], "max": [8, 3, 16, 16]}}
    runner = TensorRTRunner(out.artifact.path)
    assert runner.input_names == ("x",) and len(runner.output_names) == 1
    reference = OrtRunner(conv_onnx.path)
    rng = np.random.default_rng(0)
    for n in (1, 8):
        x = rng.standard_normal((n, 3, 16, 16), dtype=np.float32)
        got = runner.run({"x": x})[0]
        assert got.shape == (n, 4)
        assert max_abs(reference.run({"x": x})[0], got) < 1e-2


@needs_tensorrt
def test_timing_cache_is_saved_and_reused(conv_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    first = build(conv_onnx, tmp_path, target="h100", optimization_level=1)
    cache = Path(first.details.timing_cache)
    assert cache.is_file() and cache.stat().st_size > 0
    assert cache.parent == tmp_path / "cache" / "tensorrt" and cache.name.startswith("timing-")
    assert first.details.timing_cache_reused is False
    second = build(conv_onnx, tmp_path, target="h100", optimization_level=1)
    assert second.details.timing_cache == str(cache) and second.details.timing_cache_reused is True
    off = build(conv_onnx, tmp_path, target="h100", optimization_level=1, timing_cache=False)
    assert off.details.timing_cache is None
