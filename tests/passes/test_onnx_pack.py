"""``passes/lower/onnx_pack.py``: sibling projections (MatMuls on one activation through transposed weights, each
with its bias) packed into one MatMul, a bias Add and a Split, computing what they computed; a projection whose
output the graph returns is left as it is."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from infopt.passes.lower.onnx_pack import pack_projections

ir = pytest.importorskip("onnx_ir")
FLOAT = ir.DataType.FLOAT


def projections(returned: int | None = None):
    """``x [2, 8]`` through three projections ``x @ W_i.T + b_i`` (widths 4, 6, 4) summed into ``y``; projection
    ``returned`` (if any) also a graph output."""
    rng = np.random.default_rng(0)
    x = ir.Value(name="x", type=ir.TensorType(FLOAT), shape=ir.Shape([2, 8]))
    nodes, initializers, outputs = [], [], []
    for i, width in enumerate((4, 6, 4)):
        w = ir.Value(name=f"w{i}", type=ir.TensorType(FLOAT), shape=ir.Shape([width, 8]),
                     const_value=ir.tensor(rng.standard_normal((width, 8)).astype(np.float32)))
        b = ir.Value(name=f"b{i}", type=ir.TensorType(FLOAT), shape=ir.Shape([width]),
                     const_value=ir.tensor(rng.standard_normal(width).astype(np.float32)))
        initializers += [w, b]
        t = ir.Node("", "Transpose", [w], attributes=[ir.AttrInt64s("perm", [1, 0])], name=f"t{i}")
        m = ir.Node("", "MatMul", [x, t.outputs[0]], name=f"m{i}")
        a = ir.Node("", "Add", [m.outputs[0], b], name=f"a{i}")
        a.outputs[0].name, a.outputs[0].type = f"p{i}", ir.TensorType(FLOAT)
        nodes += [t, m, a]
        outputs.append(a.outputs[0])
    sliced = [ir.Node("", "ReduceSum", [o], attributes=[ir.AttrInt64("keepdims", 0)], name=f"s{i}")
              for i, o in enumerate(outputs)]
    total = ir.Node("", "Sum", [s.outputs[0] for s in sliced], name="total")
    total.outputs[0].name, total.outputs[0].type = "y", ir.TensorType(FLOAT)
    returned_values = [total.outputs[0]] + ([outputs[returned]] if returned is not None else [])
    graph = ir.Graph([x], returned_values, nodes=[*nodes, *sliced, total], initializers=initializers,
                     opset_imports={"": 18})
    return ir.Model(graph, ir_version=9)


def run(model) -> list[np.ndarray]:
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("returned", [None, 1])
def test_sibling_projections_are_packed_and_compute_what_they_computed(returned):
    want = run(projections(returned))
    model = projections(returned)
    assert pack_projections(model.graph) == 1
    ops = Counter(n.op_type for n in model.graph)
    members = 3 if returned is None else 2  # the projection the graph returns keeps its own nodes
    assert ops["Split"] == 1 and ops["MatMul"] == 4 - members and ops["Add"] == 4 - members
    assert ops["Transpose"] == 3 - members
    packed = next(n for n in model.graph if n.op_type == "MatMul" and n.inputs[1].is_initializer())
    assert list(packed.inputs[1].const_value.shape) == [8, 8 if returned == 1 else 14]
    for got, expected in zip(run(model), want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
