"""SmoothQuant keeps the function, the probe matches real QDQ, placements differ as TensorRT needs,
and the fallback moves layers to FP32 in sensitivity order until a budget holds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from infopt.core.errors import UsageError
from infopt.core.inputspec import InputSpec
from infopt.quantize import onnx_int8, sensitivity, smoothquant
from infopt.quantize.calib_data import load_calibration
from infopt.quantize.calibrate import calibrate
from infopt.quantize.observers import Observer
from infopt.quantize.sensitivity import Budget
from infopt.validators.metrics import sqnr_db
from tests.quantize.helpers import layernorm_matmul, run

SPEC = InputSpec.parse(["x:float32[batch,16]"])


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    path = layernorm_matmul(tmp_path / "m.onnx")
    x = np.random.default_rng(3).standard_normal((128, 16)).astype(np.float32)
    data = load_calibration([x], SPEC, samples=None, batch_size=64)
    layers = onnx_int8.layers(onnx.load(str(path)))
    return tmp_path, path, x, data, layers


def test_layers_are_the_matmuls_with_constant_weights(setup):
    _, _, _, _, layers = setup
    assert [(layer.node, layer.activation, layer.weight, layer.channel_axis) for layer in layers] == [
        ("fc1", "ln", "fc1.weight", 1), ("fc2", "r", "fc2.weight", 1)]


def test_smoothquant_keeps_outputs_and_flattens_the_outlier_channel(setup):
    tmp, path, x, data, layers = setup
    model = onnx.load(str(path))
    groups = smoothquant.smoothable(layers)
    table = calibrate(path, [], data, Observer("minmax"), channel_tensors=list(groups))
    result = smoothquant.smooth(model, groups, table.channel_absmax, alpha=0.5, fold_only=False)
    assert (result.folded, result.inserted, result.layers) == (1, 1, 2)
    smoothed = tmp / "smoothed.onnx"
    onnx.save(model, str(smoothed))
    before, after = run(path, x), run(smoothed, x)
    assert np.abs(before - after).max() < 1e-4 * np.abs(before).max()
    spread = lambda t: max(t) / np.median(t)  # noqa: E731
    after_table = calibrate(smoothed, [], data, Observer("minmax"), channel_tensors=["ln"])
    assert spread(after_table.channel_absmax["ln"]) < spread(table.channel_absmax["ln"]) / 4
    folded_only = onnx.load(str(path))
    assert smoothquant.smooth(folded_only, groups, table.channel_absmax, fold_only=True).inserted == 0
    even_enough = onnx.load(str(path))  # fc1's input has a 40x outlier channel, fc2's none that large
    picked = smoothquant.smooth(even_enough, groups, table.channel_absmax, min_outlier_ratio=20.0)
    assert (picked.groups, picked.layers) == (1, 1)


def test_probe_is_exact_when_off_and_matches_real_qdq_when_on(setup):
    tmp, path, x, data, layers = setup
    table = calibrate(path, onnx_int8.calibration_tensors(layers), data, Observer("minmax"))
    probe = sensitivity.Probe(path, layers, table.ranges)
    try:
        fp32 = run(path, x)
        assert np.array_equal(probe.run([{"x": x}], np.zeros(2))[0], fp32)
        emulated = probe.run([{"x": x}], np.ones(2))[0]
    finally:
        probe.close()
    real = run(onnx_int8.quantize_static(path, tmp / "q.onnx", table.ranges, ["fc1", "fc2"]), x)
    error = sqnr_db(fp32, real)
    assert 15 < error < 60  # really quantized, and not broken
    assert sqnr_db(real, emulated) > error + 10  # the probe models the real rounding closely


def test_placements(setup):
    tmp, path, _, data, layers = setup
    table = calibrate(path, onnx_int8.calibration_tensors(layers), data, Observer("minmax"))

    def zero_points(p):
        m = onnx.load(str(p))
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        zps = [inits[n.input[2]] for n in m.graph.node if n.op_type == "QuantizeLinear"]
        weight_qdq = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0].endswith(".weight")]
        return zps, weight_qdq

    cpu_zps, cpu_wq = zero_points(onnx_int8.quantize_static(path, tmp / "cpu.onnx", table.ranges, ["fc1", "fc2"]))
    trt_zps, trt_wq = zero_points(onnx_int8.quantize_static(path, tmp / "trt.onnx", table.ranges, ["fc1", "fc2"],
                                                            placement="tensorrt"))
    assert {z.dtype for z in cpu_zps} == {np.dtype("uint8")} and not cpu_wq
    assert {z.dtype for z in trt_zps} == {np.dtype("int8")} and all(not z.any() for z in trt_zps)
    assert len(trt_wq) == 2  # weights keep an explicit Q/DQ pair


def test_fallback_follows_sensitivity_until_the_budget_holds(setup):
    _, path, _, data, layers = setup
    table = calibrate(path, onnx_int8.calibration_tensors(layers), data, Observer("minmax"))
    probe = sensitivity.Probe(path, layers, table.ranges)
    try:
        budget = Budget("sqnr_db", 0.0)
        ranked = sensitivity.rank(probe, data.batches, budget)
        assert [r["drift"]["sqnr_db"] for r in ranked] == sorted(r["drift"]["sqnr_db"] for r in ranked)
        assert sensitivity.choose_fallback(probe, data.batches, budget, ranked)[0] == []
        full = sensitivity.choose_fallback(probe, data.batches, Budget("max_abs", -1.0), ranked)  # unreachable
        assert full[0] == [r["layer"] for r in ranked] and not full[1][-1]["holds"]
        alone = ranked[1]["drift"]["sqnr_db"]  # the less sensitive layer, alone, meets this budget
        one = sensitivity.choose_fallback(probe, data.batches, Budget("sqnr_db", alone - 0.01), ranked)
        assert one[0] == [ranked[0]["layer"]] and one[1][-1]["holds"]
    finally:
        probe.close()


@pytest.mark.parametrize("text, message", [("cosine", "names no known metric"), ("speed=3", "names no known metric"),
                                           ("top1=high", "is not a number")])
def test_bad_budgets(text, message):
    with pytest.raises(UsageError, match=message):
        Budget.parse(text)
    assert Budget.parse("top1=0.99").threshold_name == "min_top1"


def test_top1_budget_on_a_non_classifier_output_is_a_usage_error(tmp_path):
    """x[batch, seq, 16] -> MatMul -> y[batch, seq, 8]: no [batch, classes] output to take top-1 of."""
    from onnx import TensorProto, helper

    from infopt.core.artifact import Artifact
    from infopt.core.pass_api import PassContext, get_pass
    from infopt.core.target import get_target

    weight = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "seq_mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [numpy_helper.from_array(weight, "w")])
    path = tmp_path / "seq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    artifact = Artifact("onnx", InputSpec.parse(["x:float32[batch,seq,16]"]), path=path, output_names=("y",))
    x = np.random.default_rng(1).standard_normal((4, 5, 16)).astype(np.float32)
    definition = get_pass("quantize_int8")
    context = PassContext(get_target("cpu"), tmp_path, budget="top1=0.99", check_batches=[{"x": x}])
    with pytest.raises(UsageError) as caught:
        definition.run(artifact, definition.parse_options({}), context)
    assert "top1" in caught.value.what and "[batch, classes]" in caught.value.what and "(4, 5, 8)" in caught.value.what
    assert "cosine_mean" in caught.value.fix
    context.budget = "cosine_mean=0.9"  # the same model under a metric it has builds
    assert definition.run(artifact, definition.parse_options({}), context).details.budget_met
