"""The fallback's cost order: each layer's time from ONNX Runtime's profiler, attributed by node name,
and layers moved to FP32 by drift per millisecond saved rather than drift alone."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infopt.quantize import layer_timing, onnx_int8
from infopt.quantize.sensitivity import Budget, order_by_cost


def test_a_kernel_belongs_to_the_longest_layer_name_it_extends():
    layers = ["node_MatMul_1", "node_MatMul_10", "node_MatMul_1_2"]
    assert layer_timing.owner("node_MatMul_1/MatMulAddFusion", layers) == "node_MatMul_1"
    assert layer_timing.owner("node_MatMul_10_quant", layers) == "node_MatMul_10"
    assert layer_timing.owner("node_MatMul_1_2_quant", layers) == "node_MatMul_1_2"
    assert layer_timing.owner("node_MatMul_1", layers) == "node_MatMul_1"
    assert layer_timing.owner("node_MatMul_100", layers) is None
    assert layer_timing.owner("x_QuantizeLinear", layers) is None


def chain(path, widths: list[int]):
    """MatMul -> Relu -> MatMul ... with random constant weights, named nodes, input ``x[batch, widths[0]]``."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        inits.append(numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"node_MatMul_{i}"))
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"node_Relu_{i}"))
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", widths[0]])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", widths[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_every_layer_gets_its_own_kernel_time_in_fp32_and_int8(tmp_path):
    src = chain(tmp_path / "chain.onnx", [256, 512, 512, 16])
    layers = [x.node for x in onnx_int8.layers(onnx.load(str(src)), onnx_int8.DYNAMIC_OPS)]
    assert len(layers) == 3
    int8 = onnx_int8.quantize_dynamic(src, tmp_path / "int8.onnx", layers)
    feed = {"x": np.random.default_rng(1).standard_normal((32, 256)).astype(np.float32)}
    for path in (src, int8):
        per_layer = layer_timing.per_layer(layer_timing.kernel_times(path, feed, runs=5), layers)
        assert set(per_layer) == set(layers) and all(ms > 0 for ms in per_layer.values()), per_layer
    saved = layer_timing.savings(src, int8, layers, feed, runs=5)
    assert set(saved) == set(layers) and all(np.isfinite(v) for v in saved.values())


def row(layer: str, cosine: float, sqnr: float = 30.0) -> dict:
    drift = {"cosine_mean": cosine, "sqnr_db": sqnr}
    return {"layer": layer, "op": "MatMul", "module": "", "drift": drift, "badness": Budget("cosine_mean", 0.99).badness(drift)}


def test_layers_leave_int8_by_drift_per_millisecond_saved():
    budget = Budget("cosine_mean", 0.99)
    ranked = [row("big", 0.990), row("small", 0.995), row("slow", 0.999), row("exact", 1.0)]
    saved = {"big": 1.0, "small": 0.1, "slow": -0.2, "exact": 0.5}
    ordered = order_by_cost(ranked, saved, budget)
    # slow saves nothing in INT8, so it goes first; small costs 0.005 per 0.1 ms (0.05/ms), big 0.01 per 1 ms
    assert [r["layer"] for r in ordered] == ["slow", "small", "big", "exact"]
    assert ordered[1]["drift_per_ms"] == pytest.approx(0.05) and ordered[2]["drift_per_ms"] == pytest.approx(0.01)
    assert ordered[0]["drift_per_ms"] is None and ordered[0]["ms_saved"] == -0.2


def test_ties_on_a_coarse_metric_are_broken_by_noise_per_millisecond():
    budget = Budget("top1", 0.99)
    ranked = [{"layer": name, "drift": {"top1": 1.0, "sqnr_db": sqnr}, "badness": 0.0} for name, sqnr in (("a", 40.0), ("b", 20.0))]
    assert [r["layer"] for r in order_by_cost(ranked, {"a": 0.001, "b": 1.0}, budget)] == ["a", "b"]


@pytest.mark.parametrize(("metric", "value", "loss"), [("cosine_mean", 0.98, 0.02), ("top1", 1.0, 0.0), ("max_abs", 0.3, 0.3),
                                                       ("sqnr_db", 20.0, 0.01), ("cosine_min", None, 0.0)])
def test_budget_loss_is_the_distance_from_an_exact_output(metric, value, loss):
    assert Budget(metric, 0.5).loss({metric: value}) == pytest.approx(loss)
