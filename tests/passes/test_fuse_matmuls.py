"""Sibling MatMul fusion is exact in FP32, gives dynamic INT8 the same numbers, and leaves alone what
it cannot fuse."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infopt.passes.onnx.fuse_matmuls import fuse, siblings
from infopt.quantize import onnx_int8
from infopt.runtime.backends.onnxruntime import OrtRunner


def attention_like(path, *, bias: bool = True, shared_weight: bool = False, shared_zero_bias: bool = False,
                   opset: int = 17):
    """x[batch, seq, 32] -> three projections (q, k, v, each with a bias Add unless ``bias`` is off),
    summed pairwise so every projection reaches the outputs; plus an unrelated MatMul on its own.
    ``shared_zero_bias``: q and k add one all-zero bias initializer, as an exporter stores the equal
    biases of a freshly initialised model, and the lone MatMul's output adds it too."""
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for name, width in (("q", 16), ("k", 16), ("v", 24)):
        w = f"w{name}" if not (shared_weight and name == "k") else "wq"
        if w not in {i.name for i in inits}:
            inits.append(numpy_helper.from_array(rng.standard_normal((32, width)).astype(np.float32), w))
        nodes.append(helper.make_node("MatMul", ["x", w], [f"{name}_mm"], name=f"proj_{name}"))
        out = f"{name}_mm"
        if bias:
            b = "zeros16" if shared_zero_bias and name in "qk" else f"b{name}"
            if b not in {i.name for i in inits}:
                value = np.zeros(width) if b == "zeros16" else rng.standard_normal(width)
                inits.append(numpy_helper.from_array(value.astype(np.float32), b))
            nodes.append(helper.make_node("Add", [out, b], [f"{name}_out"], name=f"bias_{name}"))
            out = f"{name}_out"
        outs.append(out)
    nodes.append(helper.make_node("Relu", [outs[0]], ["q_relu"], name="relu_q"))
    width = 16 if shared_zero_bias else 8
    inits.append(numpy_helper.from_array(rng.standard_normal((16, width)).astype(np.float32), "w_alone"))
    nodes.append(helper.make_node("MatMul", ["q_relu", "w_alone"], ["alone_mm" if shared_zero_bias else "alone"],
                                  name="alone"))
    if shared_zero_bias:
        nodes.append(helper.make_node("Add", ["alone_mm", "zeros16"], ["alone"], name="alone_bias"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", w])
         for n, w in (("alone", width), (outs[1], 16), (outs[2], 24))], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def outputs(path, x):
    return OrtRunner(path).run({"x": x})


@pytest.mark.parametrize(("bias", "opset"), [(True, 17), (False, 17), (True, 11)])
def test_fused_projections_compute_the_same_outputs(tmp_path, bias, opset):
    src = attention_like(tmp_path / "m.onnx", bias=bias, opset=opset)
    model = onnx.load(str(src))
    assert fuse(model) == 1
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMul") == 2 and ops.count("Split") == 1 and ops.count("Add") == (1 if bias else 0)
    onnx.save(model, str(tmp_path / "fused.onnx"))
    x = np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)
    for a, b in zip(outputs(src, x), outputs(tmp_path / "fused.onnx", x)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_bias_initializer_shared_with_other_nodes_is_kept_where_still_read(tmp_path):
    src = attention_like(tmp_path / "m.onnx", shared_zero_bias=True)
    model = onnx.load(str(src))
    assert fuse(model) == 1
    onnx.checker.check_model(model)
    names = {i.name for i in model.graph.initializer}
    assert "zeros16" in names, "the lone MatMul's Add still reads the shared bias"
    assert not {"wq", "wk", "wv", "bv"} & names, "the fused members' own constants are gone"
    onnx.save(model, str(tmp_path / "fused.onnx"))
    x = np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)
    for a, b in zip(outputs(src, x), outputs(tmp_path / "fused.onnx", x)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_dynamic_int8_of_the_fused_model_matches_the_unfused_one(tmp_path):
    """Per-channel weight scales are per output column, so concatenating the weights changes no number."""
    src = attention_like(tmp_path / "m.onnx")
    model = onnx.load(str(src))
    fuse(model)
    onnx.save(model, str(tmp_path / "fused.onnx"))
    x = np.random.default_rng(2).standard_normal((4, 7, 32)).astype(np.float32)
    results = []
    for path in (src, tmp_path / "fused.onnx"):
        layers = [x.node for x in onnx_int8.layers(onnx.load(str(path)), onnx_int8.DYNAMIC_OPS)]
        results.append(outputs(onnx_int8.quantize_dynamic(path, path.with_suffix(".int8.onnx"), layers), x))
    fp32 = outputs(src, x)
    for plain, fused, exact in zip(*results, fp32):
        np.testing.assert_allclose(fused, plain, rtol=1e-4, atol=1e-4)
        assert np.abs(fused - exact).max() > 1e-3  # it is INT8: the comparison above is not FP32 against FP32


def test_what_cannot_be_fused_is_left_alone(tmp_path):
    # a weight that two projections share stays as it is, and one projection left alone is no group
    assert siblings(onnx.load(str(attention_like(tmp_path / "shared.onnx", shared_weight=True)))) == []
    # a projection without a bias Add among ones with a bias: not fused
    mixed = onnx.load(str(attention_like(tmp_path / "m.onnx")))
    mixed.graph.node.remove(next(n for n in mixed.graph.node if n.name == "bias_v"))
    next(o for o in mixed.graph.output if o.name == "v_out").name = "v_mm"
    assert siblings(mixed) == [] and fuse(mixed) == 0
