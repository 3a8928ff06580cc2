"""Backends end to end: ``--backend inductor`` and ``--backend auto`` on CPU with the candidate table,
a GPU target without TensorRT (ONNX plus a Triton config whose server builds the engine), and the
target/precision/backend combinations that cannot be built, each with its exit code."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from google.protobuf import text_format

import infopt
from infopt.runtime.backends.inductor import AotiRunner
from infopt.runtime.cpp_compiler import package_compiler
from tests.support.cli import assert_clean_failure, run_cli, run_cli_here
from tests.support.compilers import static_libstdcxx_gxx

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
CNN = ("--input", "x:float32[batch,1,8,8]", "--dim", "batch=1:8:64")


def triton_config(path):
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture(scope="module")
def cnn_auto(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("auto") / "digits"
    proc = run_cli_here("build", str(files / "cnn_ts.pt"), *CNN, "--val", str(files / "digits_val.npz"),
                        "--batch-sizes", "1,16", "--backend", "auto", "--name", "digits", "--output", str(out), cwd=out.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc.stdout


def test_auto_builds_every_cpu_candidate_and_ships_the_fastest(cnn_auto):
    out, printed = cnn_auto
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {c["recipe"]: c for c in manifest["candidates"]}
    assert list(rows) == ["fp32-onnxruntime", "fp32-onnxruntime-fused", "fp32-inductor"]
    # the CNN has no transformer block: the fused variant is the same file and is not timed twice
    assert rows["fp32-onnxruntime-fused"]["status"] == "skipped"
    assert "same model file as fp32-onnxruntime" in rows["fp32-onnxruntime-fused"]["reason"]
    built = [c for c in manifest["candidates"] if c["status"] == "built"]
    assert [c["recipe"] for c in built] == ["fp32-onnxruntime", "fp32-inductor"]
    assert all(c["passed"] and c["max_abs"] <= 1e-4 and set(c["p50_ms"]) == {"1", "16"} for c in built)
    chosen = [c for c in built if c["chosen"]]
    assert len(chosen) == 1 and chosen[0]["speedup"] == max(c["speedup"] for c in built)
    assert manifest["recipe"]["name"] == chosen[0]["recipe"] and manifest["backend"] == chosen[0]["backend"]
    assert "fastest" in manifest["selection"]
    suffix = ".pt2" if chosen[0]["backend"] == "inductor" else ".onnx"
    assert manifest["artifacts"]["model"] == f"model/model{suffix}"
    report = (out / "report.md").read_text()
    assert "## Candidates" in report and "| fp32-inductor | pass |" in report
    assert "Candidates" in printed and "fp32-inductor" in printed


@pytest.fixture
def static_cxx(tmp_path, monkeypatch):
    """$CXX set to a g++ that links libstdc++ statically, whose packages end the process that loads them."""
    static = static_libstdcxx_gxx(tmp_path / "static-bin")
    monkeypatch.setenv("CXX", str(static))
    package_compiler.cache_clear()
    yield static
    package_compiler.cache_clear()


def test_inductor_backend_ships_a_pt2_that_loads_validates_and_serves(files, digits, tmp_path, static_cxx):
    out = tmp_path / "digits"
    proc = run_cli_here("build", str(files / "cnn_ts.pt"), *CNN, "--val", str(files / "digits_val.npz"),
                        "--batch-sizes", "1", "--backend", "inductor", "--name", "digits", "--output", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "inductor" and manifest["artifacts"]["model"] == "model/model.pt2"
    assert [p["name"] for p in manifest["passes"]][-1] == "aoti_compile"
    # $CXX's libraries crash a torch process: the next compiler on PATH built the package, and the notes say so
    compiled = manifest["passes"][-1]
    assert compiled["details"]["compiler"] == shutil.which("g++")
    assert f"C++ compiler {shutil.which('g++')}, not {static_cxx}: " in " ".join(compiled["notes"])
    assert manifest["outputs"] == [{"name": "output", "dtype": "float32", "shape": ["batch", 10]}]
    assert manifest["validation"]["device"] == "cpu (AOTInductor package), in a worker process"  # fenced
    runner = infopt.load(out)
    assert isinstance(runner, AotiRunner)
    x, y = digits[1]["val"]
    logits = np.concatenate([runner(x[i:i + 64]) for i in range(0, len(x), 64)])
    assert float((logits.argmax(1) == y).mean()) == pytest.approx(digits[1]["accuracy"], abs=1 / len(y))
    cfg = triton_config(out / "servers/triton/digits/config.pbtxt")
    assert cfg.backend == "python" and cfg.max_batch_size == 64
    assert (out / "servers/triton/digits/1/model.pt2").is_file() and (out / "servers/triton/digits/1/model.py").is_file()
    check = run_cli("validate", str(out), "--json")
    assert check.returncode == 0, check.stderr[-1500:]
    assert json.loads(check.stdout)["verdict"]["passed"] is True


def test_no_compiler_whose_packages_load_is_an_environment_failure(files, tmp_path):
    static = static_libstdcxx_gxx(tmp_path / "only-bin")
    out = tmp_path / "dist" / "m"
    proc = run_cli("build", str(files / "cnn_ts.pt"), *CNN, "--backend", "inductor", "-o", str(out), cwd=tmp_path,
                   env={"PATH": str(static.parent), "INFOPT_CACHE_DIR": str(tmp_path / "cache")})
    assert_clean_failure(proc, 4, "no C++ compiler here builds an AOTInductor package", f"{static}: a library it builds",
                         "set CXX to a compiler that links libstdc++ dynamically", out=out)


def test_h100_int8_without_tensorrt_ships_onnx_and_a_server_built_engine(digits, files, tmp_path):
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=digits[1]["train"][0][:200])
    out = tmp_path / "digits"
    proc = run_cli_here("build", str(files / "cnn_ts.pt"), *CNN, "--target", "h100", "--int8", "--calib", str(calib),
                        "--val", str(files / "digits_val.npz"), "--batch-sizes", "1", "--name", "digits", "--output", str(out),
                        cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "tensorrt" and manifest["recipe"]["name"] == "int8-tensorrt"
    assert manifest["artifacts"]["model"] == "model/model.onnx"
    record = next(p for p in manifest["passes"] if p["name"] == "tensorrt_build")
    assert record["details"]["engine"] == "server" and record["details"]["precision_mode"] == "INT8"
    ops = {n.op_type for n in onnx.load(str(out / "model/model.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    cfg = triton_config(out / "servers/triton/digits/config.pbtxt")
    assert cfg.backend == "onnxruntime"
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    accelerator = cfg.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accelerator.name == "tensorrt" and accelerator.parameters["precision_mode"] == "INT8"
    assert accelerator.parameters["trt_profile_max_shapes"] == "x:64x1x8x8"
    notes = " ".join(manifest["validation"]["notes"])
    assert "built on the server" in notes and "not on the target" in notes
    assert "built on the server" in proc.stdout.replace("\n", " ") or "built on the server" in (out / "report.md").read_text()
    assert "backend preference" in manifest["selection"]
    assert [c["recipe"] for c in manifest["candidates"]] == ["int8-tensorrt", "int8-onnxruntime", "int8-inductor"]
    assert manifest["candidates"][2]["status"] == "skipped"  # no CUDA GPU here, and TorchScript has no Linear modules
    assert manifest["validation"]["verdict"]["passed"] is True


@pytest.mark.parametrize("args, code, needles", [
    (("--target", "h100", "--fp8"), 2, ("FP8 needs calibration data", "pass --calib")),
    (("--target", "h100", "--fp8", "--backend", "tensorrt", "--calib", "VAL"), 4, ("fp8-tensorrt", "TensorRT")),
    (("--target", "h100", "--backend", "inductor"), 4, ("CUDA GPU",)),
    (("--target", "t4", "--bf16"), 2, ("does not run bf16", "fp32, fp16, int8, int4")),
    (("--target", "cpu", "--int8", "--backend", "inductor"), 2, ("no bundled recipe builds int8", "int4 (onnxruntime, inductor)")),
    (("--target", "cpu", "--backend", "tensorrt"), 2, ("does not list backend tensorrt",)),
])
def test_combinations_that_cannot_be_built_here(files, tmp_path, args, code, needles):
    import torch

    if code == 4 and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "dist" / "m"
    args = [str(files / "digits_val.npz") if a == "VAL" else a for a in args]
    proc = run_cli_here("build", str(files / "cnn_ts.pt"), *CNN, *args, "-o", str(out), cwd=tmp_path)
    assert_clean_failure(proc, code, *needles, out=out)
