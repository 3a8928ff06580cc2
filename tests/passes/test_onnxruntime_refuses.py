"""The fused-graph check: ONNX Runtime's word on whether it opens a graph with its optimizations, without folding
the weights (``passes/onnx/checks.onnxruntime_refuses``)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from infopt.passes.onnx.checks import onnxruntime_refuses


def _model(op: str = "MatMul", domain: str = "") -> object:
    """x [2, 4] times a transposed [3, 4] weight: the Transpose ONNX Runtime folds when it may."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node(op, ["x", "wt"], ["y"], domain=domain)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [weight])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def test_a_graph_onnxruntime_runs_opens_with_and_without_optimizations():
    model = _model()
    assert onnxruntime_refuses(model) is None and onnxruntime_refuses(model, optimize=True) is None


def test_an_op_onnxruntime_has_no_kernel_for_is_refused_with_its_reason():
    refused = onnxruntime_refuses(_model("NoSuchFusedOp", "com.microsoft"), optimize=True)
    assert refused is not None and "NoSuchFusedOp" in refused
