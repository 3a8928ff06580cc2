"""The commands README.md and the guide (docs/guide/) show, typed as they show them: a fresh working directory,
relative paths, default output folders. Only the model is ours (the trained digits CNN, so shapes are 1x8x8).
Each test names the page whose commands it runs; tests/test_docs.py maps every README command to its test."""

from __future__ import annotations

import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from tests.support.cli import ROOT, run_cli

CNN_INPUT = "x:float32[batch,1,8,8]"


@pytest.fixture
def workdir(files, tmp_path):
    """model.pt, val.npz, data/val/ and data/calib/ in a fresh folder, as a user's project holds them."""
    shutil.copy(files / "cnn_ts.pt", tmp_path / "model.pt")
    with np.load(files / "digits_val.npz") as data:
        x, labels = data["x"], data["labels"]
    np.savez(tmp_path / "val.npz", x=x[:128])
    for name, rows in (("val", slice(0, 160)), ("calib", slice(160, 360))):
        folder = tmp_path / "data" / name
        folder.mkdir(parents=True)
        for i in range(rows.start, rows.stop, 40):
            np.savez(folder / f"part{i}.npz", x=x[i:i + 40], labels=labels[i:i + 40])
    return tmp_path


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{proc.stdout[-1500:]}"
    return proc


def manifest(folder):
    return json.loads((folder / "manifest.json").read_text())


def test_first_command_default_output(workdir):
    """README.md's first build, also on docs/guide/output-folder.md and targets-and-backends.md: ``dist/model/``."""
    proc = ok(run_cli("build", "model.pt", "--target", "cpu", "--val", "val.npz", cwd=workdir))
    assert "wrote dist/model/" in proc.stdout
    m = manifest(workdir / "dist" / "model")
    assert m["validation"]["verdict"]["passed"] and m["inputs"]["inputs"][0]["name"] == "x"
    assert (workdir / "dist" / "model" / "servers" / "torchserve" / "model-store" / "model.mar").is_file()
    assert not list(workdir.glob("dist/.model.*")), "a staging folder was left behind"
    # where the time went: the build's steps and every candidate's passes, in the manifest, the report and one line
    timings = m["timings"]
    steps = {(s["step"], s.get("of")) for s in timings["steps"]}
    assert {("load", None), ("validation", None), ("latency", None), ("curve", None), ("emit", None)} <= steps
    assert {("onnx_export", "fp32-onnxruntime"), ("aoti_compile", "fp32-inductor")} <= steps
    assert [s for s, of in steps].count("capture") == 1  # shared by the candidates, run once
    assert 0 < sum(s["seconds"] for s in timings["steps"]) <= timings["total_s"]
    assert re.search(r"^build took \d+\.\d s: \w", proc.stdout, re.M), proc.stdout[-500:]
    assert "## Build time" in (workdir / "dist" / "model" / "report.md").read_text()


def test_models_and_inputs_commands(workdir):
    """docs/guide/models-and-inputs.md's inspect, build and validate; README.md's ``infopt validate dist/model``."""
    proc = ok(run_cli("inspect", "model.pt", "--input", CNN_INPUT, cwd=workdir))
    assert "Conv" in proc.stdout or "conv" in proc.stdout
    ok(run_cli("build", "model.pt", "--input", CNN_INPUT, "--dim", "batch=1:8:64", "--val", "data/val/",
               "--batch-sizes", "1,8,32", "--max-abs", "1e-4", cwd=workdir))
    m = manifest(workdir / "dist" / "model")
    assert m["validation"]["drift"]["worst"]["max_abs"] <= 1e-4 and m["validation"]["drift"]["samples"] == 160
    assert {r["batch"] for r in m["validation"]["latency"]} == {1, 8, 32}
    proc = ok(run_cli("validate", "dist/model", "--json", cwd=workdir))
    assert json.loads(proc.stdout)["verdict"]["passed"]


def test_int8_example(workdir):
    """README.md's and docs/guide/int8.md's INT8 build."""
    ok(run_cli("build", "model.pt", "--int8", "--calib", "data/calib/", "--val", "data/val/",
               "--max-drift", "cosine_mean=0.995", cwd=workdir))
    m = manifest(workdir / "dist" / "model")
    details = next(p for p in m["passes"] if p["name"] == "quantize_int8")["details"]
    assert details["mode"] == "static" and m["validation"]["drift"]["worst"]["cosine_mean"] >= 0.995
    assert m["validation"]["drift"]["source"] == "data/val"


def test_int8_without_val_is_judged_on_held_out_calibration_samples(workdir):
    """docs/guide/int8.md's build with --calib and no --val."""
    ok(run_cli("build", "model.pt", "--input", CNN_INPUT, "--int8", "--calib", "data/calib/", cwd=workdir))
    m = manifest(workdir / "dist" / "model")
    drift = m["validation"]["drift"]
    assert drift["source"] == "data/calib (held out of calibration)" and not drift["random_inputs"]
    assert drift["samples"] == 50  # a quarter of the 200 calibration samples, never calibrated on
    assert drift["worst"]["top1"] >= 0.98 and m["validation"]["verdict"]["passed"]
    assert "held out of calibration" in (workdir / "dist" / "model" / "report.md").read_text()


def test_gate_example(workdir):
    """README.md's gate, and docs/guide/release-gate.md's with the baseline's manifest and a summary (5 trials, not
    15, to keep the test short)."""
    ok(run_cli("build", "model.pt", "--target", "cpu", "--val", "data/val/", "--output", "dist/model", cwd=workdir))
    shutil.copytree(workdir / "dist" / "model", workdir / "released" / "model")
    proc = run_cli("gate", "dist/model", "--baseline", "released/model", "--val", "data/val/", "--junit", "gate.xml",
                   "--trials", "5", cwd=workdir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    suite = ET.parse(workdir / "gate.xml").getroot()
    cases = suite.iter("testcase")
    assert sum(1 for _ in cases) >= 5 and not list(suite.iter("failure"))
    proc = run_cli("gate", "dist/model", "--baseline", "released/model/manifest.json", "--val", "data/val/",
                   "--junit", "gate.xml", "--summary", "gate.md", "--trials", "5", cwd=workdir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (workdir / "gate.md").read_text().strip() and not list(ET.parse(workdir / "gate.xml").getroot().iter("failure"))


@pytest.mark.slow
def test_make_demo_commands(tmp_path):
    """What README.md's ``make demo`` runs, from a fresh folder: train the examples, build with relative paths."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "examples.train", "--out", "examples/out"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=300)
    ok(run_cli("build", "examples/out/digits_cnn.pt", "--input", CNN_INPUT, "--val", "examples/out/digits_val.npz",
               "--output", "dist/digits_cnn", "--force", cwd=tmp_path))
    assert manifest(tmp_path / "dist" / "digits_cnn")["validation"]["verdict"]["passed"]
    assert "# infopt build: digits_cnn" in (tmp_path / "dist" / "digits_cnn" / "report.md").read_text()
