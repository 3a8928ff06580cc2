"""INT8 chosen by measurement: the variants tried, the choice among them and against FP32, and what a
build from the command line ships and says. Which variant is fastest depends on the machine, so the
end-to-end tests check that what shipped agrees with what was measured, not which one won."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import onnx
import pytest

from infopt.core import onnx_graph
from infopt.quantize import int8_variants, onnx_int8
from infopt.quantize.int8_variants import Tried, choose, pooled_layers, timing_feeds
from infopt.validators.timing import RatioEstimate
from tests.support.cli import run_cli

CNN_INPUT = "x:float32[batch,1,8,8]"
INTEGER_OPS = {"QLinearConv", "QGemm", "QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "QuantizeLinear"}


def ratio(batch: int, value: float, spread: float = 0.05) -> RatioEstimate:
    return RatioEstimate(batch, value, 1.0, value, value - spread, value + spread, 0.97, 5, 3)


def tried(name: str, holds: bool, *ratios: float) -> Tried:
    entry = Tried(name, "why", ["a", "b"], drift={"cosine_mean": 0.999 if holds else 0.9}, holds=holds)
    entry.ratios = [ratio(b, r) for b, r in zip((1, 8), ratios)]
    return entry


def test_the_fastest_variant_that_holds_the_budget_ships():
    best, why = choose([tried("base", True, 0.8, 0.7), tried("signed", True, 0.6, 0.5), tried("loose", False)], False)
    assert best.name == "signed" and why.startswith("the fastest INT8 variant") and "batch 8" in why
    assert abs(best.speed - (0.6 * 0.5) ** 0.5) < 1e-9


def test_a_declared_batch_mix_weighs_each_batch_size_in_the_choice():
    """INT8 faster at batch 32 and slower at batch 1: the served mix decides whether it ships."""
    mostly_single = {1: 0.9, 32: 0.1}
    variant = Tried("base", "why", ["a"], drift={"cosine_mean": 0.999}, holds=True)
    variant.ratios = [ratio(1, 1.3), ratio(32, 0.6)]
    best, why = choose([variant], False, mostly_single)
    assert best is None and abs(variant.speed - math.exp(0.9 * math.log(1.3) + 0.1 * math.log(0.6))) < 1e-9
    assert "weighted by the declared batch mix (1: 90%, 32: 10%)" in why
    best, why = choose([variant], False, {1: 0.1, 32: 0.9})
    assert best is variant and best.speed < 1 and "1: 10%, 32: 90%" in why
    best, _ = choose([variant], False)  # equal weights: the geometric mean of 1.3 and 0.6 is below 1
    assert best is variant and abs(best.speed - (1.3 * 0.6) ** 0.5) < 1e-9


def test_fp32_ships_when_no_variant_is_faster_unless_int8_is_required():
    variants = [tried("base", True, 1.3, 1.8), tried("pooled", True, 1.2, 1.4)]
    best, why = choose(variants, False)
    assert best is None and "INT8 is slower than FP32" in why and "shipped FP32" in why and "pooled" in why
    best, why = choose(variants, True)
    assert best.name == "pooled" and "shipped INT8 as required" in why


def test_when_no_variant_holds_the_budget_the_confirmed_model_is_kept_for_the_verdict_to_judge():
    best, why = choose([tried("base", False), tried("signed", False)], False)
    assert best.name == "base" and "no INT8 variant held the drift budget" in why


def cnn_onnx(files, tmp_path):
    """The example CNN as ONNX, the way the INT8 pass gets it (named nodes)."""
    from infopt.core.inputspec import InputSpec
    from infopt.exporters.torch_export import export_module
    from infopt.passes.lower.onnx_export import export_onnx
    from infopt.runtime.loading import load_model

    spec = InputSpec.parse([CNN_INPUT])
    program = export_module(load_model(files / "cnn_ts.pt").module, spec)
    path = tmp_path / "cnn.onnx"
    export_onnx(program, path, spec.names, ("logits",))
    model = onnx.load(str(path))
    onnx_graph.ensure_node_names(model)
    return model, onnx_graph.save_model(model, tmp_path / "src.onnx")


def test_layers_after_a_pooling_op_are_found(files, tmp_path):
    model, _ = cnn_onnx(files, tmp_path)
    layers = onnx_int8.layers(model)
    assert [x.op for x in layers] == ["Conv", "Conv", "Gemm"]
    assert pooled_layers(model, layers) == [layers[2].node]


def test_timing_feeds_repeat_samples_to_reach_a_batch_size():
    batches = [{"x": np.arange(6, dtype=np.float32).reshape(3, 2)}, {"x": np.full((2, 2), 9, np.float32)}]
    feeds = timing_feeds(batches, [1, 8])
    assert feeds[1]["x"].shape == (1, 2) and feeds[8]["x"].shape == (8, 2)
    assert feeds[8]["x"][5].tolist() == [0, 1] and feeds[8]["x"][4].tolist() == [9, 9]


def test_timing_feeds_are_at_the_sequence_length_the_model_serves():
    """--val data 2 tokens long, a model declared to serve 5 (seq's opt): the variants are timed at 5, the
    tokens repeated; a longer one is cut. The static dim and the batch rows are left alone."""
    from infopt.core.inputspec import DimRange, InputSpec, parse_tensor

    spec = InputSpec((parse_tensor("ids:int64[batch,seq]"), parse_tensor("feat:float32[batch,3]")),
                     {"seq": DimRange(1, 5, 16)})
    ids = np.array([[1, 2], [3, 4], [5, 6]], np.int64)
    feeds = timing_feeds([{"ids": ids, "feat": np.zeros((3, 3), np.float32)}], [1, 4], spec)
    assert feeds[4]["ids"].shape == (4, 5) and feeds[4]["feat"].shape == (4, 3)
    assert feeds[4]["ids"][1].tolist() == [3, 4, 3, 4, 3] and feeds[4]["ids"][3].tolist() == [1, 2, 1, 2, 1]
    long = timing_feeds([{"ids": np.arange(14).reshape(2, 7), "feat": np.zeros((2, 3), np.float32)}], [1], spec)
    assert long[1]["ids"].tolist() == [[0, 1, 2, 3, 4]]


@pytest.fixture(scope="module")
def cli_builds(files, digits, tmp_path_factory):
    """The CNN built from the command line as a user would: declaring the batches it serves (a quarter of the
    requests at batch 1, the rest at 32), and with --require-precision at --batch-sizes 1."""
    _, data = digits
    work = tmp_path_factory.mktemp("variants")
    shutil.copy(files / "cnn_ts.pt", work / "cnn.pt")
    np.savez(work / "calib.npz", x=data["train"][0][:256])
    np.savez(work / "val.npz", x=data["val"][0][:128])
    runs = {}
    for label, extra in (("default", ["--dim", "batch=1:32:64", "--batch-mix", "1:1,32:3"]),
                         ("required", ["--require-precision", "--batch-sizes", "1"])):
        proc = run_cli("build", "cnn.pt", "--input", CNN_INPUT, "--int8", "--calib", "calib.npz", "--val", "val.npz",
                       "--max-drift", "top1=0.99", "-o", f"dist/{label}", *extra, cwd=work)
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[label] = (proc, work / "dist" / label)
    return runs


def shipped(dist):
    manifest = json.loads((dist / "manifest.json").read_text())
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_int8")["details"]
    ops = {n.op_type for n in onnx.load(str(dist / "model" / "model.onnx")).graph.node}
    return manifest, details, ops


def test_a_default_build_ships_what_it_measured_as_fastest(cli_builds):
    proc, dist = cli_builds["default"]
    manifest, details, ops = shipped(dist)
    names = [v["name"] for v in details["variants"]]
    assert names[0] == "u8 activations, per-channel weights" and len(names) == 5
    assert "layers after pooling in float" in names[1] and "s8 activations" in names[2] and "per-tensor" in names[3]
    assert names[4] == "s8 activations, per-tensor weights"  # ONNX Runtime quantize_static's defaults
    timed = [v for v in details["variants"] if v["holds_budget"]]
    # timed at the sizes the model serves, as the candidates are, and weighed by the declared mix
    assert timed and all({r["batch"] for r in v["ratios"]} == {1, 32} for v in timed)
    assert {row["batch"] for row in manifest["validation"]["latency"]} == {1, 32}
    for v in timed:
        ratios = {r["batch"]: r["ratio"] for r in v["ratios"]}
        assert abs(v["speed_vs_fp32"] - math.exp(0.25 * math.log(ratios[1]) + 0.75 * math.log(ratios[32]))) < 1e-9
    assert "weighted by the declared batch mix (1: 25%, 32: 75%)" in details["selection"]
    fastest = min(timed, key=lambda v: v["speed_vs_fp32"])
    report = (dist / "report.md").read_text()
    assert "INT8 variants" in report and fastest["name"] in report
    if fastest["speed_vs_fp32"] >= 1:  # no INT8 graph was faster than FP32 on this machine
        assert details["shipped"] == "fp32" and manifest["precision"] == "fp32" and manifest["precision_asked"] == "int8"
        assert not ops & INTEGER_OPS
        assert "INT8 is slower than FP32" in proc.stdout and "--require-precision" in proc.stdout
        assert "met by the FP32 model shipped" in report
    else:
        assert details["shipped"] == "int8" and details["shipped_variant"] == fastest["name"]
        assert manifest["precision"] == "int8" and ops & INTEGER_OPS


def test_require_precision_ships_the_fastest_int8_variant(cli_builds):
    _, dist = cli_builds["required"]
    manifest, details, ops = shipped(dist)
    timed = [v for v in details["variants"] if v["holds_budget"]]
    fastest = min(timed, key=lambda v: v["speed_vs_fp32"])
    assert details["shipped"] == "int8" and details["shipped_variant"] == fastest["name"]
    assert manifest["precision"] == "int8" and "precision_asked" not in manifest
    assert ops & INTEGER_OPS
    assert all({r["batch"] for r in v["ratios"]} == {1} for v in timed)  # --batch-sizes 1: the size it serves
    int8_layers = [r for r in details["layers"] if r["precision"] == "int8"]
    assert len(int8_layers) == fastest["int8_layers"]


def test_variants_module_builds_each_variant_it_names(files, tmp_path):
    """Each variant is a real, different model: activation type and weight scales show in its tensors."""
    model, src = cnn_onnx(files, tmp_path)
    layers = onnx_int8.layers(model)
    ranges = {name: (-4.0, 4.0) for name in onnx_int8.calibration_tensors(layers)}
    variants = int8_variants.candidates("static", src, model, layers, [x.node for x in layers], ranges)
    zero_point_types, scale_sizes = [], []
    for i, variant in enumerate(variants):
        graph = onnx.load(str(variant.write(tmp_path / f"v{i}.onnx"))).graph
        inits = {t.name: t for t in graph.initializer}
        zero_point_types.append({inits[n.input[2]].data_type for n in graph.node if n.op_type == "QuantizeLinear"})
        scale_sizes.append(max(int(np.prod(inits[n.input[1]].dims)) for n in graph.node if n.op_type == "DequantizeLinear"
                               and n.input[1] in inits))
    assert zero_point_types[0] == {onnx.TensorProto.UINT8} and zero_point_types[2] == {onnx.TensorProto.INT8}
    assert scale_sizes[0] > 1 and scale_sizes[3] == 1, "per-channel weights have a scale per channel, per-tensor one"
    assert zero_point_types[4] == {onnx.TensorProto.INT8} and scale_sizes[4] == 1  # ONNX Runtime's S8S8 per-tensor
    assert len(variants[1].nodes) == 2
