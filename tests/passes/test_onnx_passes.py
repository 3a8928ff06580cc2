"""ONNX export and ONNX Runtime optimization: ops after the pass, numbers unchanged, checker."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from infopt.runtime.backends.onnxruntime import OrtRunner
from infopt.runtime.runner import TorchRunner
from infopt.validators.metrics import cosine, max_abs
from tests.support.passes import capture, run_pass


@pytest.fixture
def cnn_onnx(digits, tmp_path):
    art = capture(digits[0], "x:float32[batch,1,8,8]")
    reference = TorchRunner(art.obj.module(), ("x",))
    out = run_pass("onnx_export", art, tmp_path)
    return out.artifact, reference


def test_export_names_dims_and_matches(cnn_onnx, digits):
    art, reference = cnn_onnx
    model = onnx.load(str(art.path))
    onnx.checker.check_model(model, full_check=True)
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 1, 8, 8]
    assert [d.dim_param or d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == ["batch", 10]
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == 2 and ops["Gemm"] == 1 and "Dropout" not in ops
    runner = OrtRunner(art.path, optimize=False)
    for n in (1, 3, 64):  # the batch dim is really dynamic
        x = digits[1]["val"][0][:n]
        assert max_abs(reference.run({"x": x})[0], runner.run({"x": x})[0]) < 1e-4


def test_ort_optimize_fuses_and_matches(cnn_onnx, digits, tmp_path):
    art, reference = cnn_onnx
    before = Counter(n.op_type for n in onnx.load(str(art.path)).graph.node)
    out = run_pass("ort_optimize", art, tmp_path)
    model = onnx.load(str(out.artifact.path))
    onnx.checker.check_model(model)
    after = Counter(n.op_type for n in model.graph.node)
    assert out.changed and sum(after.values()) < sum(before.values())
    assert after["FusedConv"] == 2 and "BatchNormalization" not in after
    x = digits[1]["val"][0][:50]
    got = OrtRunner(out.artifact.path).run({"x": x})[0]
    assert max_abs(reference.run({"x": x})[0], got) < 1e-4
    assert cosine(reference.run({"x": x})[0], got) > 0.99999


def test_ort_basic_level_keeps_standard_ops(cnn_onnx, tmp_path):
    art, _ = cnn_onnx
    out = run_pass("ort_optimize", art, tmp_path, level="basic")
    domains = {n.domain for n in onnx.load(str(out.artifact.path)).graph.node}
    assert domains <= {"", "ai.onnx"}


def test_encoder_exports_with_two_dynamic_dims(encoder, tmp_path):
    model, data = encoder
    art = capture(model, "input_ids:int64[batch,seq]", ["batch=1:8:64", "seq=2:16:64"])
    reference = TorchRunner(art.obj.module(), ("input_ids",))
    out = run_pass("onnx_export", art, tmp_path)
    graph_input = onnx.load(str(out.artifact.path)).graph.input[0]
    assert [d.dim_param for d in graph_input.type.tensor_type.shape.dim] == ["batch", "seq"]
    runner = OrtRunner(out.artifact.path)
    ids = data["val"][0]
    for n, s in ((1, 16), (5, 9), (32, 40)):
        feed = {"input_ids": np.ascontiguousarray(np.resize(ids[:n], (n, s)))}
        assert max_abs(reference.run(feed)[0], runner.run(feed)[0]) < 1e-4
