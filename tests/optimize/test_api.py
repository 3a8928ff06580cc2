"""The Python API in a training repo: build from an nn.Module and example inputs, then load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import infopt
from infopt.core.errors import UsageError


def test_build_from_module_and_load(digits, tmp_path):
    model, data = digits
    x = torch.from_numpy(data["val"][0][:8])
    result = infopt.build(model, example_inputs=(x,), target="cpu", precision="fp32", backend="onnxruntime",
                          output=tmp_path / "cnn", progress=False, batch_sizes=[1, 4])
    assert isinstance(result, infopt.BuildResult)
    assert result.passed and result.output_dir == tmp_path / "cnn"
    assert result.drift["random_inputs"] is True  # no val data given: flagged
    assert {r.batch for r in result.latency if r.runner == "infopt"} == {1, 4}
    assert result.manifest.precision == "fp32" and result.manifest.artifacts.model == "model/model.onnx"
    assert result.manifest.to_json() == json.loads((tmp_path / "cnn" / "manifest.json").read_text())
    assert "random inputs" in (tmp_path / "cnn" / "report.md").read_text()
    runner = infopt.load(result.output_dir)
    expected = model(x).detach().numpy()
    np.testing.assert_allclose(runner(x), expected, atol=1e-4)
    assert runner.input_names == ("x",)
    one_thread = result.load(threads=1)
    assert one_thread.session.get_session_options().intra_op_num_threads == 1
    np.testing.assert_allclose(one_thread(x), expected, atol=1e-4)


def test_load_refuses_non_dist(tmp_path):
    with pytest.raises(UsageError, match="manifest.json"):
        infopt.load(tmp_path)


def test_build_from_onnx_file(digits, tmp_path):
    """An ONNX file skips capture; the reference is the ONNX model run unoptimized."""
    model, data = digits
    x = torch.from_numpy(data["val"][0][:8])
    first = infopt.build(model, example_inputs=(x,), backend="onnxruntime", output=tmp_path / "a", progress=False)
    second = infopt.build(first.output_dir / "model" / "model.onnx", output=tmp_path / "b", progress=False)
    passes = second.manifest.to_json()["passes"]
    assert [p["skipped"] for p in passes] == [True, True, True, True, False, False]  # mask fill and ort_optimize run
    assert second.manifest.source.format == "onnx" and second.passed
    assert second.drift["worst"]["max_abs"] <= 1e-4
    rows = {c["recipe"]: c for c in second.manifest.candidates}  # auto: what an ONNX source can and cannot become
    assert rows["fp32-onnxruntime"]["chosen"]
    assert rows["fp32-inductor"]["status"] == "skipped" and "source is already onnx" in rows["fp32-inductor"]["reason"]


def test_thread_cap_reaches_every_session_and_the_manifest_says_so(digits, tmp_path, monkeypatch):
    model, data = digits
    x = torch.from_numpy(data["val"][0][:8])
    monkeypatch.setenv("INFOPT_THREADS", "2")
    result = infopt.build(model, example_inputs=(x,), backend="onnxruntime", output=tmp_path / "cnn", progress=False,
                          batch_sizes=[1])
    assert any(n.startswith("INFOPT_THREADS=2:") for n in result.manifest.validation.notes)
    assert infopt.load(result.output_dir).session.get_session_options().intra_op_num_threads == 2
    monkeypatch.delenv("INFOPT_THREADS")
    assert infopt.load(result.output_dir).session.get_session_options().intra_op_num_threads == 0
