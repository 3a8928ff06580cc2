"""FP8 for real: ``--fp8`` writes E4M3 Q/DQ (``passes/onnx/quantize_fp8.py``), calibrated, into the ONNX model that
TensorRT builds FP8 engines from, and ONNX Runtime's CPU provider validates it (FP8 emulated: the drift is real).
The real all-MiniLM-L6-v2 and transformers' text families are built from the command line, as docs/guide/targets-and-backends.md shows."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

from infopt.quantize import onnx_fp8
from infopt.quantize.onnx_int8 import layers
from infopt.quantize.sensitivity import output_drift
from infopt.runtime.backends.onnxruntime import OrtRunner
from tests.support.cli import run_cli_here

transformers = pytest.importorskip("transformers")


def fp8_graph(path) -> dict[str, int]:
    """Q/DQ nodes by op whose zero point is float8e4m3fn, and the float8 weights, read from the graph itself."""
    model = onnx.load(str(path), load_external_data=False)
    counts = onnx_fp8.fp8_nodes(path)
    counts["fp8 weights"] = sum(1 for i in model.graph.initializer
                                if i.data_type == onnx.TensorProto.FLOAT8E4M3FN and len(i.dims) >= 2)
    return counts


def test_fp8_qdq_rounds_like_e4m3_and_keeps_an_mlp_close(tmp_path):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    src = tmp_path / "mlp.onnx"
    torch.onnx.export(mlp, (torch.randn(4, 32),), str(src), input_names=["x"], output_names=["y"], dynamo=False,
                      dynamic_axes={"x": {0: "batch"}}, opset_version=17)
    model = onnx.load(str(src))
    found = layers(model)
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    fp32 = OrtRunner(src).run({"x": x})[0]
    taps = {found[0].activation: (float(x.min()), float(x.max()))}
    hidden = torch.nn.functional.gelu(mlp[0](torch.from_numpy(x))).detach().numpy()
    taps[found[1].activation] = (float(hidden.min()), float(hidden.max()))
    dst = onnx_fp8.quantize(src, tmp_path / "fp8.onnx", found, taps)
    assert fp8_graph(dst) == {"QuantizeLinear": 2, "DequantizeLinear": 4, "fp8 weights": 2}
    assert onnx.load(str(dst)).opset_import[0].version >= onnx_fp8.MIN_OPSET  # raised from 17
    got = OrtRunner(dst).run({"x": x})[0]
    drift = output_drift([fp32], [got])
    assert 0.995 <= drift["cosine_mean"] < 1.0  # rounded (E4M3 keeps 3 mantissa bits), and close
    assert np.abs(got - fp32).max() > 1e-4
    # the weights read back are E4M3 values times their channel's scale: at most 2^-4 relative error per weight
    weight = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == found[0].weight))
    shape = [1] * weight.ndim
    shape[found[0].channel_axis] = -1
    scales = onnx_fp8.weight_scales(weight, found[0].channel_axis).reshape(shape)
    codes = np.frombuffer(onnx_fp8.to_e4m3_bytes(weight / scales), np.uint8)
    back = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy().reshape(weight.shape) * scales
    assert np.abs(back - weight).max() <= np.abs(weight).max() * 2 ** -4


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The real all-MiniLM-L6-v2 folder under its own name, with calibration and held-out validation sentences."""
    from examples.minilm import model_dir, sentences

    folder = tmp_path_factory.mktemp("minilm-fp8")
    shutil.copytree(model_dir(), folder / "all-MiniLM-L6-v2")
    calibration, evaluation = sentences()
    (folder / "sentences.txt").write_text("\n".join(calibration) + "\n")
    (folder / "held-out.txt").write_text("\n".join(evaluation[:64]) + "\n")
    return folder


@pytest.mark.slow
def test_minilm_at_fp8_from_the_command_line_is_e4m3_qdq_within_cosine_099(minilm):
    proc = run_cli_here("build", "all-MiniLM-L6-v2", "--fp8", "--calib", "sentences.txt", "--val", "held-out.txt",
                        "--batch-sizes", "1,8", "-q", cwd=minilm)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist = minilm / "dist" / "all-MiniLM-L6-v2"
    manifest = json.loads((dist / "manifest.json").read_text())
    assert manifest["precision"] == "fp8" and manifest["backend"] == "onnxruntime"
    graph = fp8_graph(dist / "model" / "model.onnx")
    assert graph["fp8 weights"] == 36 and graph["DequantizeLinear"] >= 36 + graph["QuantizeLinear"] > 36
    drift = manifest["validation"]["drift"]
    assert drift["source"].startswith("held-out.txt") and drift["worst"]["cosine_mean"] >= 0.99
    assert manifest["validation"]["verdict"]["passed"]
    passes = {p["name"]: p for p in manifest["passes"]}
    assert passes["quantize_fp8"]["details"]["calibration_samples"] > 0
    assert any("emulated" in note for note in passes["quantize_fp8"]["notes"])
    assert "emulated" in (dist / "report.md").read_text()


TEXT_FAMILIES = ("bert", "electra-tokens", "xlmr-classifier", "qwen2")


@pytest.fixture(scope="module")
def text_zoo(tmp_path_factory):
    from tests.support.zoo import FAMILIES

    folder = tmp_path_factory.mktemp("fp8-zoo")
    for name in TEXT_FAMILIES:
        torch.manual_seed(0)
        FAMILIES[name]().eval().save_pretrained(folder / f"tiny-{name}")
    rng = np.random.default_rng(0)
    np.savez(folder / "calib.npz", input_ids=rng.integers(3, 512, (32, 16)), attention_mask=np.ones((32, 16), np.int64))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_the_zoo_s_text_families_build_at_fp8(text_zoo, family):
    from tests.support.zoo import TOKEN_TYPES

    calib = "calib.npz"
    if family in TOKEN_TYPES:
        data = dict(np.load(text_zoo / "calib.npz"))
        np.savez(text_zoo / f"calib-{family}.npz", **data, token_type_ids=np.zeros_like(data["input_ids"]))
        calib = f"calib-{family}.npz"
    out = f"dist-{family}-fp8"
    proc = run_cli_here("build", f"tiny-{family}", "--fp8", "--calib", calib, "--dim", "batch=1:2:4",
                        "--dim", "seq=1:16:32", "--batch-sizes", "1", "-o", out, "-q", "--strict", cwd=text_zoo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((text_zoo / out / "manifest.json").read_text())
    assert manifest["precision"] == "fp8" and manifest["validation"]["verdict"]["passed"]
    assert manifest["validation"]["drift"]["worst"]["cosine_mean"] >= 0.99
    assert fp8_graph(text_zoo / out / "model" / "model.onnx")["fp8 weights"] > 0


def test_fp8_without_calibration_or_without_a_layer_is_refused_clearly(tmp_path):
    torch.jit.save(torch.jit.trace(torch.nn.ReLU().eval(), torch.randn(2, 4)), str(tmp_path / "relu.pt"))
    torch.jit.save(torch.jit.trace(torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)), str(tmp_path / "linear.pt"))
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))
    spec = ["--input", "x:float32[batch,4]", "--batch-sizes", "1"]
    uncalibrated = run_cli_here("build", "linear.pt", *spec, "--fp8", cwd=tmp_path)
    assert uncalibrated.returncode == 2 and "FP8 needs calibration data" in uncalibrated.stderr
    assert "fix:   pass --calib" in uncalibrated.stderr and "Traceback" not in uncalibrated.stderr
    clipped = run_cli_here("build", "linear.pt", *spec, "--fp8", "--calib", "calib.npz", "--calib-method", "percentile",
                           "--calib-percentile", "99.9", "-o", "clipped", "-q", cwd=tmp_path)
    assert clipped.returncode == 0, clipped.stderr[-2000:]
    details = next(p for p in json.loads((tmp_path / "clipped" / "manifest.json").read_text())["passes"]
                   if p["name"] == "quantize_fp8")["details"]
    assert details["method"] == "percentile"
    entropy = run_cli_here("build", "linear.pt", *spec, "--fp8", "--calib", "calib.npz", "--calib-method", "entropy",
                           "-o", "entropy", cwd=tmp_path)
    assert entropy.returncode == 2 and "Traceback" not in entropy.stderr and "amax" in entropy.stderr
    no_layer = run_cli_here("build", "relu.pt", *spec, "--fp8", "--calib", "calib.npz", cwd=tmp_path)
    assert no_layer.returncode == 2, no_layer.stderr
    assert "--fp8 quantizes MatMul, Gemm and Conv layers with constant weights, and this model has none" in no_layer.stderr
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())
    assert not (tmp_path / "entropy").exists()


def test_a_budget_fp8_misses_moves_the_layers_that_drift_most_back_to_float(tmp_path):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 4)).eval()
    torch.jit.save(torch.jit.trace(mlp, torch.randn(2, 16)), str(tmp_path / "mlp.pt"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((64, 16)).astype(np.float32))
    np.savez(tmp_path / "val.npz", x=rng.standard_normal((64, 16)).astype(np.float32))
    proc = run_cli_here("build", "mlp.pt", "--input", "x:float32[batch,16]", "--fp8", "--calib", "calib.npz",
                        "--val", "val.npz", "--max-drift", "cosine_mean=0.99999", "--batch-sizes", "1", "-q",
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "dist" / "mlp" / "manifest.json").read_text())
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_fp8")["details"]
    kept = [row for row in details["layers"] if row["precision"] == "float (fallback)"]
    assert 1 <= len(kept) and all(row["cosine_mean"] is not None for row in details["layers"])  # ranked, alone
    assert details["measured"]["cosine_mean"] >= 0.99999 and manifest["validation"]["verdict"]["passed"]
    worst_alone = min(details["layers"], key=lambda row: row["cosine_mean"])
    assert worst_alone["precision"] == "float (fallback)"  # the one that drifts most went back first


@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_the_pytorch_8bit_linears_stay_close_and_keep_what_the_gpu_kernel_cannot_take(precision):
    from infopt.quantize.linear_8bit import Fp8Linear, Int8Linear, swap

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16)).eval()
    x = torch.randn(8, 5, 64)
    with torch.no_grad():
        reference = mlp(x)
        swapped, kept = swap(mlp, precision, "cpu")
        got = mlp(x)
    assert swapped == ["0", "2"] and not kept
    assert isinstance(mlp[0], Fp8Linear if precision == "fp8" else Int8Linear)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0).item()
    assert 0.99 <= cosine < 1.0
    odd = torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.Linear(24, 16))
    swapped, kept = swap(odd, precision, "cuda", keep_float=())
    if precision == "fp8":  # CUDA's FP8 GEMM takes multiples of 16: 24 is not
        assert swapped == [] and kept[0].startswith("0 (64x24: cuda's fp8 kernel needs multiples of 16)")
    else:  # INT8's takes multiples of 8
        assert swapped == ["0", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp8", "int8"])
def test_the_pytorch_route_builds_a_bert_folder_the_cpu_checks(text_zoo, precision):
    """``--recipe fp8-inductor`` (``int8-inductor``) on the CPU: the program a CUDA target without TensorRT gets,
    compiled by AOTInductor for this CPU, where its drift is checked."""
    out = f"dist-bert-{precision}-inductor"
    proc = run_cli_here("build", "tiny-bert", "--recipe", f"{precision}-inductor", "--dim", "batch=1:2:4",
                        "--dim", "seq=1:16:32", "--batch-sizes", "1", "-o", out, "-q", cwd=text_zoo)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((text_zoo / out / "manifest.json").read_text())
    assert manifest["precision"] == precision and manifest["backend"] == "inductor"
    assert (text_zoo / out / "model" / "model.pt2").is_file()
    details = next(p for p in manifest["passes"] if p["name"] == "quantize_linear_8bit")["details"]
    assert len(details["swapped"]) == 13  # 2 layers x (query, key, value, output, intermediate, output), the pooler
    assert manifest["validation"]["drift"]["worst"]["cosine_mean"] >= 0.99 and manifest["validation"]["verdict"]["passed"]


def test_a_cuda_target_at_fp8_and_int8_has_a_pytorch_candidate(text_zoo):
    for flags in (["--fp8", "--calib", "calib.npz"], ["--int8", "--calib", "calib.npz"]):
        proc = run_cli_here("build", "tiny-qwen2", "--target", "h100", *flags, "--dry-run", "--json", cwd=text_zoo)
        assert proc.returncode == 0, proc.stderr[-2000:]
        plan = {c["recipe"]: c for c in json.loads(proc.stdout)["candidates"]}
        pytorch = plan[f"{flags[0][2:]}-inductor"]
        assert pytorch["passes"][0] == "quantize_linear_8bit"
        assert pytorch["skipped"] is None or "CUDA GPU" in pytorch["skipped"]  # built where a GPU is, said here
