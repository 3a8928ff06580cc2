"""`infopt build` end to end through the installed command, on the trained example models."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from google.protobuf import text_format

import infopt
from infopt.core.errors import ValidationFailed
from tests.support.cli import run_cli

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


@pytest.fixture(scope="module")
def cnn_dist(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "digits"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", "--dim", "batch=1:8:64",
                   "--val", str(files / "digits_val.npz"), "--batch-sizes", "1,16", "--name", "digits", "--output", str(out),
                   "--backend", "onnxruntime", "--price-per-hour", "0.5", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def encoder_dist(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "encoder"
    proc = run_cli("build", str(files / "encoder.pt2"), "--val", str(files / "encoder_val.npz"), "--output", str(out),
                   "--backend", "onnxruntime")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc.stdout


def test_cnn_layout_and_manifest(cnn_dist):
    out, printed, _ = cnn_dist
    for rel in ("manifest.json", "report.md", "model/model.onnx", "servers/triton/digits/config.pbtxt",
                "servers/triton/digits/1/model.onnx", "validation/samples.npz"):
        assert (out / rel).is_file(), rel
    manifest = json.loads((out / "manifest.json").read_text())
    assert printed["name"] == manifest["name"] == "digits"
    assert manifest["target"]["name"] == "cpu" and manifest["precision"] == "fp32"
    assert [p["name"] for p in manifest["passes"]] == ["capture", "remove_noops", "fold_batchnorm", "onnx_export",
                                                          "attention_mask_fill", "ort_optimize"]
    assert next(p for p in manifest["passes"] if p["name"] == "attention_mask_fill")["changed"] is False  # no attention
    assert all(p["seconds"] > 0 and p["size_bytes"] > 0 for p in manifest["passes"])
    assert manifest["recipe"]["name"] == "fp32-onnxruntime"
    assert set(manifest["files"]) == {"model/model.onnx", "servers/triton/digits/config.pbtxt",
                                      "servers/triton/digits/1/model.onnx", "validation/samples.npz", "report.md",
                                      "report.html", "servers/kserve/inferenceservice.yaml",
                                      "servers/torchserve/model-store/digits.mar", "servers/torchserve/config.properties"}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    assert {"torch", "onnx", "onnxruntime", "python", "torch.cuda"} <= set(manifest["versions"])
    drift = manifest["validation"]["drift"]
    assert drift["random_inputs"] is False and drift["samples"] == 256
    assert drift["worst"]["max_abs"] <= 1e-4 and drift["worst"]["top1"] == 1.0
    latency = manifest["validation"]["latency"]
    assert sorted({(r["runner"], r["batch"]) for r in latency}) == [("eager", 1), ("eager", 16), ("infopt", 1), ("infopt", 16)]
    assert all(0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] for r in latency)
    assert manifest["validation"]["verdict"]["passed"] is True


def test_cpu_target_roof_is_measured_here_and_the_price_comes_from_the_flag(cnn_dist):
    out, _, _ = cnn_dist
    target = json.loads((out / "manifest.json").read_text())["target"]
    assert target["memory_bandwidth_gbs"] > 0 and target["peak_tflops"]["fp32"] > 0
    assert target["measured"].startswith("measured on this machine") and target["price_per_hour"] == 0.5
    report = (out / "report.md").read_text()
    roofline = report.split("## Roofline", 1)[1].split("## ", 1)[0]
    assert "| 1 |" in roofline and "measured on this machine" in roofline  # a roof for the default target
    cost = report.split("## Cost per million predictions", 1)[1].split("## ", 1)[0]
    rows = [line.split("|")[1:4] for line in cost.splitlines() if line.startswith("| 1 ") or line.startswith("| 16 ")]
    for batch, rate, usd in rows:  # USD per 1M = price / 3600 / samples per second x 1e6
        assert float(usd) == pytest.approx(0.5 / 3600 / float(rate) * 1e6, rel=1e-2)
    assert len(rows) == 2


def test_json_says_the_verdict_output_and_choice_first_and_stderr_has_step_lines(cnn_dist):
    """A script reads passed/output/chosen at the top; a CI log (stderr is not a terminal here) gets
    one timestamped line as each step starts and ends, and no blank lines."""
    out, printed, stderr = cnn_dist
    assert list(printed)[:3] == ["passed", "output", "chosen"]
    assert printed["passed"] is True and printed["output"] == str(out)
    assert printed["chosen"]["recipe"] == "fp32-onnxruntime" and printed["chosen"]["backend"] == "onnxruntime"
    assert printed["chosen"]["speedup"] > 0 and set(printed["chosen"]["p50_ms"]) == {"1", "16"}
    lines = stderr.splitlines()
    assert lines and all(re.match(r"\[ *\d+ s\] \S", line) for line in lines), stderr[-2000:]
    assert any(line.endswith("pass capture (1/6)") for line in lines)
    assert any(line.endswith("pass ort_optimize done") for line in lines)
    assert any("validating: drift against the eager reference: done" in line for line in lines)


@pytest.mark.parametrize(("args", "kind", "fix"), [
    (["build", "missing.pt"], "cannot load model", "relative to the current folder"),
    (["build", "missing.pt", "--no-such-flag"], "bad input", "build --help"),
])
def test_json_errors_are_a_json_object_on_stdout(args, kind, fix, tmp_path):
    proc = run_cli(*args, "--json", cwd=tmp_path)
    assert proc.returncode == 2
    error = json.loads(proc.stdout)
    assert error["passed"] is False and error["kind"] == kind and error["exit_code"] == 2 and fix in error["fix"]
    assert set(error) == {"passed", "error", "kind", "where", "fix", "exit_code"}
    assert "error (" in proc.stderr  # the person reading the log still gets the text


def test_cnn_report_and_triton_config(cnn_dist):
    out, _, _ = cnn_dist
    report = (out / "report.md").read_text()
    for heading in ("## Passes", "## Drift against the eager reference", "## Latency (ms)", "| fold_batchnorm |"):
        assert heading in report
    runs = sorted({row["iterations"] for row in json.loads((out / "manifest.json").read_text())["validation"]["latency"]})
    assert f"{runs[0] if len(runs) == 1 else f'{runs[0]}-{runs[-1]}'} timed runs per row" in report  # what the rows took
    cfg = text_format.Parse((out / "servers/triton/digits/config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert cfg.max_batch_size == 64 and cfg.HasField("dynamic_batching")
    assert list(cfg.input[0].dims) == [1, 8, 8] and list(cfg.output[0].dims) == [10]
    onnx.checker.check_model(str(out / "servers/triton/digits/1/model.onnx"))


def test_provenance_records_the_command_line_and_data(cnn_dist, files):
    out, _, _ = cnn_dist
    prov = json.loads((out / "manifest.json").read_text())["provenance"]
    assert prov["command"].startswith("infopt build ") and f"--val {files / 'digits_val.npz'}" in prov["command"]
    assert prov["python_call"] is None and prov["recipe"] == "fp32-onnxruntime" and prov["calibration"] is None
    with np.load(files / "digits_val.npz") as data:
        x = data["x"]
    from infopt.core.manifest import data_sha256

    # the validation data as fed: 256 samples in batches of the batch dim's max (64)
    assert prov["validation_data"]["samples"] == 256
    assert prov["validation_data"]["sha256"] == data_sha256([{"x": x[i:i + 64]} for i in range(0, 256, 64)])
    assert "## Provenance" in (out / "report.md").read_text()


def test_verify_passes_then_names_every_changed_missing_or_added_file(cnn_dist, tmp_path):
    import shutil

    out, _, _ = cnn_dist
    proc = run_cli("verify", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["passed"] and {f["status"] for f in result["files"]} == {"ok"}
    assert {"report.html", "model/model.onnx"} <= {f["path"] for f in result["files"]}
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    config = copy / "servers/triton/digits/config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 64", "max_batch_size: 65"))
    (copy / "report.html").unlink()
    (copy / "model" / "extra.bin").write_bytes(b"x")
    proc = run_cli("verify", str(copy / "manifest.json"))
    assert proc.returncode == 1, proc.stdout
    assert "servers/triton/digits/config.pbtxt: sha256 differs from the manifest" in proc.stdout
    assert "report.html: missing" in proc.stdout and "model/extra.bin: not in the manifest" in proc.stdout
    proc = run_cli("verify", str(tmp_path))
    assert proc.returncode == 2 and "not an infopt output folder" in proc.stderr


def test_built_cnn_keeps_its_accuracy(cnn_dist, digits):
    """The deployable ONNX model classifies held-out digits as well as the trained model."""
    out, _, _ = cnn_dist
    runner = infopt.load(out)
    x, y = digits[1]["val"]
    logits = np.concatenate([runner(x[i:i + 64]) for i in range(0, len(x), 64)])
    accuracy = float((logits.argmax(1) == y).mean())
    assert accuracy >= 0.95
    assert accuracy == pytest.approx(digits[1]["accuracy"], abs=1 / len(y))


def test_encoder_pt2_dynamic_batch(encoder_dist, encoder):
    out, printed = encoder_dist
    assert "PASS" in printed and "Latency" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["inputs"][0]["shape"][0] == "batch"
    assert manifest["validation"]["drift"]["worst"]["max_abs"] <= 1e-4
    model = onnx.load(str(out / "model/model.onnx"))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    runner = infopt.load(out)
    ids = encoder[1]["val"][0]
    for n in (1, 3, 50):
        assert runner(ids[:n]).shape == (n, 2)


def test_validate_passes_then_catches_tampering(encoder_dist, tmp_path):
    import shutil

    out, _ = encoder_dist
    proc = run_cli("validate", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["integrity"] == "ok" and result["verdict"]["passed"]
    assert result["drift"]["worst"]["max_abs"] <= 1e-4
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    with open(copy / "model/model.onnx", "ab") as handle:
        handle.write(b"\0")
    proc = run_cli("validate", str(copy))
    assert proc.returncode == 1 and "sha256" in proc.stdout


def test_validation_failure_exits_1_and_load_refuses(files, tmp_path):
    out = tmp_path / "strict"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--val", str(files / "digits_val.npz"), "--min-sqnr-db", "400",
                   "--backend", "onnxruntime", "--output", str(out), "-q")
    assert proc.returncode == 1, proc.stderr
    assert "FAIL" in proc.stdout and "min_sqnr_db" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["validation"]["verdict"]["passed"] is False
    with pytest.raises(ValidationFailed, match="failed validation"):
        infopt.load(out)


def test_inspect_targets_recipes_doctor_version(files):
    proc = run_cli("inspect", str(files / "cnn_ts.pt"), "--val", str(files / "digits_val.npz"), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["format"] == "torchscript" and info["parameters"] > 5000
    assert info["ops"].get("conv2d.default", 0) + info["ops"].get("convolution.default", 0) == 2
    assert info["inputs"]["dims"]["batch"] == {"min": 1, "opt": 8, "max": 64}
    assert info["outputs"][0]["shape_at_opt"][1] == 10
    proc = run_cli("targets", "--json")
    found = json.loads(proc.stdout)
    assert set(found) >= {"cpu", "gpu", "h100", "h200", "a100", "l4", "t4"}
    assert found["gpu"]["device"] == "cuda" and found["gpu"]["memory_bandwidth_gbs"] is None  # any GPU: no roofline
    proc = run_cli("recipes", "--passes", "--json")
    listed = json.loads(proc.stdout)
    assert "fold_batchnorm" in listed["passes"] and "fp32-onnxruntime-genai" in listed["recipes"]
    # which build setting (the flag) sets each option of a pass
    takes = {o["name"]: o["build_setting"] for o in listed["passes"]["quantize_int8"]["options"]}
    assert takes["method"] == "calib_method" and takes["require_int8"] == "require_precision" and takes["fallback"] is None
    proc = run_cli("doctor", "--json")
    checks = {c["component"]: c for c in json.loads(proc.stdout)}
    assert checks["onnxruntime"]["ok"] and checks["torch"]["ok"]
    # each backend's own rows, asked of its descriptor; a missing component says how to get it
    assert checks["TensorRT"]["ok"] or "install TensorRT" in checks["TensorRT"]["fix"]
    assert checks["C++ compiler (AOTInductor)"]["ok"]
    # the 8-bit routes: FP8 Q/DQ validated here (ONNX Runtime ran a tiny float8 graph), engines only with TensorRT
    assert checks["FP8 Q/DQ ONNX (--fp8)"]["ok"] and "emulated" in checks["FP8 Q/DQ ONNX (--fp8)"]["detail"]
    assert checks["FP8 and INT8 TensorRT engines"]["ok"] or "not built here" in checks["FP8 and INT8 TensorRT engines"]["detail"]
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("infopt ")


def test_help_shows_no_type_on_flags_and_a_guessed_option_gets_a_pointer(tmp_path):
    for args in (["--help"], ["build", "--help"], ["gate", "--help"]):
        proc = run_cli(*args)
        assert proc.returncode == 0
        flags = [line for line in proc.stdout.splitlines() if "<bool>" in line]
        assert all("--help" in line for line in flags), flags  # typer's own --help keeps its tag
    proc = run_cli("gate", "--markdown", "x.md", "dist/a", "dist/b", cwd=tmp_path)
    assert proc.returncode == 2 and "--summary FILE" in proc.stderr


def test_any_gpu_target_builds_without_figures(files, tmp_path):
    """--target gpu: a CUDA target with no published figures; built here without a GPU, its report says
    why there is no cost line rather than inventing one."""
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", "--target", "gpu",
                   "--backend", "onnxruntime", "--batch-sizes", "1", "-o", "dist/gpu", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "dist/gpu/manifest.json").read_text())
    assert manifest["target"]["name"] == "gpu" and manifest["target"]["device"] == "cuda"
    assert "declares no price_per_hour" in (tmp_path / "dist/gpu/report.md").read_text()


def test_dry_run_shows_the_plan_and_writes_nothing(files, tmp_path):
    import shutil

    from tests.support.cli import run_cli_here

    shutil.copy(files / "cnn_ts.pt", tmp_path / "cnn.pt")
    args = ["build", "cnn.pt", "--input", "x:float32[batch,1,8,8]", "--target", "h100", "--int8", "--calib", "calib/"]
    done = run_cli_here(*args, "--dry-run", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["dry_run"] and plan["name"] == "cnn" and plan["output"] == str(tmp_path / "dist" / "cnn")
    assert plan["format"] == "torchscript" and plan["calibration"] == "calib/" and not plan["replaces_existing"]
    assert plan["inputs"]["dims"]["batch"] == {"min": 1, "opt": 8, "max": 64}
    by_recipe = {c["recipe"]: c for c in plan["candidates"]}
    assert set(by_recipe) == {"int8-tensorrt", "int8-onnxruntime", "int8-inductor"}
    assert all("quantize_int8" in by_recipe[r]["passes"] for r in ("int8-tensorrt", "int8-onnxruntime"))
    assert by_recipe["int8-tensorrt"]["passes"][-1] == "tensorrt_build"
    # stock PyTorch's W8A8 replaces Python Linear layers, which a TorchScript file does not have
    assert "needs the model's Python module" in by_recipe["int8-inductor"]["skipped"]
    int4 = json.loads(run_cli_here("build", "cnn.pt", "--input", "x:float32[batch,1,8,8]", "--int4", "--dry-run", "--json",
                                   cwd=tmp_path).stdout)
    skipped = {c["recipe"]: c["skipped"] for c in int4["candidates"]}  # what a build would skip, and why
    assert skipped["int4-onnxruntime"] is None and "needs the model's Python module" in skipped["int4-inductor"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.pt"]  # nothing written, not even dist/
    text = run_cli_here(*args[:4], "--dry-run", cwd=tmp_path)
    assert text.returncode == 0 and "nothing was written (--dry-run)" in text.stdout and "dist/cnn" in text.stdout
    (tmp_path / "dist" / "cnn").mkdir(parents=True)  # an output the build would refuse to replace
    refused = run_cli_here(*args[:4], "--dry-run", cwd=tmp_path)
    assert refused.returncode == 2 and "--force" in refused.stderr
