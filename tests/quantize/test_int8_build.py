"""`--int8` end to end on the trained digits CNN and the token encoder: static with calibration,
dynamic without, the GPU rule, the per-layer table, the calibration cache and every bad input."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

import infopt
from tests.support.cli import run_cli, run_cli_here

CNN_INPUT = "x:float32[batch,1,8,8]"


@pytest.fixture(scope="module")
def calib(digits, tmp_path_factory):
    _, data = digits
    path = tmp_path_factory.mktemp("calib") / "digits_calib.npz"
    np.savez(path, x=data["train"][0][:300])  # training images only: calibration never sees the held-out split
    return path


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("calib-cache")


@pytest.fixture(scope="module")
def static_cnn(digits, files, calib, cache_dir, tmp_path_factory):
    model, _ = digits
    mp = pytest.MonkeyPatch()
    mp.setenv("INFOPT_CACHE_DIR", str(cache_dir))
    out = tmp_path_factory.mktemp("int8") / "digits"
    # choose: first keeps the INT8 model the fallback confirmed (its structure is what these tests check);
    # test_int8_variants.py covers the choice by timing
    result = infopt.build(model, inputs=[CNN_INPUT], precision="int8", calibration=calib, val=files / "digits_val.npz",
                          max_drift="top1=0.995", output=out, progress=False, batch_sizes=[1, 16],
                          pass_options={"quantize_int8": {"choose": "first"}})
    mp.undo()
    return result


def accuracy(predict, x, y):
    return float((np.argmax(predict(x), axis=1) == y).mean())


def test_static_int8_cnn_keeps_top1_within_half_a_point(static_cnn, digits):
    model, data = digits
    xte, yte = data["val"]
    fp32 = accuracy(lambda x: model(torch.from_numpy(x)).detach().numpy(), xte, yte)
    int8 = accuracy(static_cnn.load(), xte, yte)
    assert fp32 >= 0.95
    assert int8 >= fp32 - 0.005, (fp32, int8)
    assert static_cnn.passed
    ops = {n.op_type for n in onnx.load(str(static_cnn.output_dir / "model/model.onnx")).graph.node}
    assert "QLinearConv" in ops  # ONNX Runtime fused the QDQ pairs into integer convolutions


def test_static_int8_records_layers_calibration_and_budget(static_cnn):
    m = static_cnn.manifest.to_json()
    assert m["precision"] == "int8" and m["recipe"]["name"] == "int8-onnxruntime"
    details = next(p for p in m["passes"] if p["name"] == "quantize_int8")["details"]
    assert details["mode"] == "static" and details["placement"] == "onnxruntime" and details["budget_met"]
    assert {r["op"] for r in details["layers"]} == {"Conv", "Gemm"} and len(details["layers"]) == 3
    assert all(r["precision"] == "int8" for r in details["layers"])
    # every layer in INT8 met the budget at once, so no layer was run alone to rank it
    assert not details["ranked"] and all(r["top1"] is None for r in details["layers"])
    assert [s["excluded"] for s in details["fallback_steps"]] == [0]
    assert details["calibration"]["samples"] == 128 and details["calibration"]["method"] == "minmax"
    table = json.loads((static_cnn.output_dir / "quantization/calibration.json").read_text())
    assert table["method"] == "minmax" and len(table["ranges"]) >= 3
    assert all(lo <= 0 <= hi for lo, hi in table["ranges"].values())
    assert "quantization/calibration.json" in m["files"]
    report = (static_cnn.output_dir / "report.md").read_text()
    assert "## INT8 layers" in report and "budget top1 >= 0.995: met" in report
    checks = {c["name"] for c in m["validation"]["verdict"]["checks"]}
    assert {"min_top1", "min_mean_cosine"} <= checks  # the budget is also judged on --val


def test_rebuild_with_other_thresholds_reads_the_calibration_cache(static_cnn, digits, files, calib, cache_dir, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(cache_dir))
    model, _ = digits
    again = infopt.build(model, inputs=[CNN_INPUT], precision="int8", calibration=calib, max_drift="cosine_mean=0.999",
                         val=files / "digits_val.npz", output=tmp_path / "again", progress=False)
    details = again.manifest.pass_record("quantize_int8").details
    assert details["calibration"]["cached"] is True
    assert details["budget"] == "cosine_mean >= 0.999"


def test_unreachable_budget_is_a_failed_verdict_that_says_so(files, calib, tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "strict"
    proc = run_cli_here("build", str(files / "cnn_ts.pt"), "--input", CNN_INPUT, "--int8", "--calib", str(calib),
                        "--max-drift", "max_abs=0", "--output", str(out), "--batch-sizes", "1", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "NOT met" in proc.stdout and "every layer in FP32" in (out / "report.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_int8")["details"]
    assert details["ranked"] and all(r["max_abs"] is not None for r in details["layers"])  # ranked to choose the fallback
    assert [r["precision"] for r in details["layers"]] == ["fp32 (fallback)"] * 3
    # on a CPU target the fallback takes layers in order of drift per millisecond saved, and the rows follow it
    assert details["fallback_order"] == "drift_per_ms" and all(isinstance(r["ms_saved"], float) for r in details["layers"])
    assert details["excluded"] == [r["layer"] for r in details["layers"]]
    assert "ms saved" in (out / "report.md").read_text()
    assert any(r.startswith("max_abs") for r in manifest["validation"]["verdict"]["reasons"])


def test_dynamic_without_calibration_says_so(encoder, tmp_path):
    model, data = encoder
    ids, _ = data["val"]
    np.savez(tmp_path / "val.npz", input_ids=ids)
    result = infopt.build(model, inputs=["input_ids:int64[batch,seq]"], dims=["seq=2:16:64"], precision="int8",
                          val=tmp_path / "val.npz", output=tmp_path / "dyn", progress=False, require_precision=True)
    details = result.manifest.pass_record("quantize_int8").details
    assert details["mode"] == "dynamic" and details["layers"]
    # the data the budget was held on, named as given, against the source model: what the verdict judges by
    assert details["measured_on"] == f"{tmp_path / 'val.npz'}, against the source model (as the build is judged)"
    # so the INT8 pass's figure for the budget is the verdict's: a model chosen to meet it cannot fail it
    verdict = {c["name"]: c for c in result.manifest.validation.verdict.checks}
    assert details["budget_metric"] == "cosine_mean" and details["budget_met"] is verdict["min_mean_cosine"]["passed"]
    assert abs(details["measured"]["cosine_mean"] - verdict["min_mean_cosine"]["measured"]) < 1e-5
    assert any("INT8 is dynamic: no calibration data" in n for n in result.manifest.validation.notes)
    assert "MatMulInteger" in str(details["quantized_ops"]) or "DynamicQuantizeLinear" in details["quantized_ops"]
    assert "INT8 is dynamic" in (result.output_dir / "report.md").read_text()


def test_gpu_target_with_calibration_gets_tensorrt_placement(digits, calib, tmp_path, monkeypatch):
    monkeypatch.setenv("INFOPT_CACHE_DIR", str(tmp_path / "cache"))
    model, data = digits
    result = infopt.build(model, inputs=[CNN_INPUT], target="h100", precision="int8", calibration=calib,
                          max_drift="top1=0.99", output=tmp_path / "h100", progress=False)
    details = result.manifest.pass_record("quantize_int8").details
    assert details["placement"] == "tensorrt"
    graph = onnx.load(str(result.output_dir / "model/model.onnx")).graph
    inits = {i.name: i for i in graph.initializer}
    zero_points = [inits[n.input[2]] for n in graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.data_type == onnx.TensorProto.INT8 for z in zero_points)
    xte, yte = data["val"]
    assert accuracy(result.load(), xte, yte) >= 0.95


def test_gpu_target_without_calibration_is_an_error_before_any_work(files, tmp_path):
    out = tmp_path / "nope"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", CNN_INPUT, "--target", "h100", "--int8", "--output", str(out))
    assert proc.returncode == 2
    assert "needs static (calibrated) INT8" in proc.stderr and "--calib" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


@pytest.mark.parametrize("make, args, needle", [
    (lambda p: np.savez(p, x=np.full((4, 1, 8, 8), np.nan, np.float32)), [], "contains NaN or Inf"),
    (lambda p: np.savez(p, x=np.zeros((4, 3, 8, 8), np.float32)), [], "size 3 on axis 1"),
    (lambda p: np.savez(p, x=np.zeros((4, 1, 8, 8), np.int64)), [], "is int64, the model takes float32"),
    (lambda p: np.savez(p, x=np.zeros((0, 1, 8, 8), np.float32)), [], "holds no samples"),
    (lambda p: np.savez(p, x=np.zeros((4, 1, 8, 8), np.float32)), ["--calib-method", "kl"], "calib-method"),
    (lambda p: np.savez(p, x=np.zeros((4, 1, 8, 8), np.float32)), ["--calib-samples", "0"], "at least 1"),
    (lambda p: np.savez(p, x=np.zeros((4, 1, 8, 8), np.float32)), ["--max-drift", "speed=2"], "names no known metric"),
])
def test_bad_calibration_input(files, tmp_path, make, args, needle):
    calib = tmp_path / "bad_calib.npz"
    make(calib)
    out = tmp_path / "out"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", CNN_INPUT, "--int8", "--calib", str(calib), *args,
                   "--output", str(out))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert needle in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not out.exists()
