"""The check after each ONNX Runtime rewrite: a graph with ONNX Runtime's own default-domain ops
(which onnx's checker has no schema for) passes when ONNX Runtime loads it; a broken one still fails,
with both verdicts in the message."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infopt.passes.onnx.checks import check_for_onnxruntime
from infopt.runtime.backends.onnxruntime import OrtRunner


def rms_norm_graph(scale_dtype=np.float32):
    """x[batch, 8] -> SimplifiedLayerNormalization (ONNX Runtime's RMSNorm, in the default domain)."""
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(scale_dtype), "scale")
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-6)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_onnx_runtime_ops_that_onnx_does_not_know_pass_and_run(tmp_path):
    model = rms_norm_graph()
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for SimplifiedLayerNormalization"):
        onnx.checker.check_model(model)
    check_for_onnxruntime(model)
    onnx.save(model, str(tmp_path / "m.onnx"))
    check_for_onnxruntime(tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * np.linspace(0.5, 1.5, 8)
    np.testing.assert_allclose(OrtRunner(tmp_path / "m.onnx").run({"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_a_graph_onnx_runtime_rejects_still_fails():
    with pytest.raises(ValueError, match="onnx's checker: .*; ONNX Runtime: "):
        check_for_onnxruntime(rms_norm_graph(scale_dtype=np.int64))  # no kernel takes an int64 scale


def test_what_onnx_checks_itself_is_not_handed_to_onnx_runtime():
    model = rms_norm_graph()
    model.graph.node[0].op_type = "Relu"
    model.graph.node[0].input.append("scale")  # Relu takes one input: the checker's own verdict stands
    with pytest.raises(onnx.checker.ValidationError):
        check_for_onnxruntime(model)
