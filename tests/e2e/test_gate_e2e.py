"""`infopt gate` on real builds: an identical candidate passes 20 times out of 20, a broken INT8
quantization and a model that does extra work fail, a retrained model is judged on its task, and
bad input is refused with exit 2."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

import infopt
from examples.models import DigitsCNN, WithExtraWork
from examples.train import digits_data, fit
from infopt.validators.gate_config import GateConfig
from tests.support.cli import run_cli

IDENTICAL_RUNS = 20


def _build(model, x, out, **options):
    return infopt.build(model, example_inputs=(torch.from_numpy(x[:2]),), backend="onnxruntime", output=out,
                        progress=False, **options)


@pytest.fixture(scope="module")
def builds(digits, files, tmp_path_factory):
    model, data = digits
    x, _ = data["val"]
    root = tmp_path_factory.mktemp("gate")
    val = files / "digits_val.npz"
    out = {"val": val, "root": root}
    out["baseline"] = _build(model, x, root / "baseline", val=val).output_dir
    out["identical"] = _build(model, x, root / "identical", val=val).output_dir
    # a broken quantization: calibrated on inputs scaled by 0.02 (a preprocessing mismatch), so every
    # activation range is far too narrow and INT8 clips the real data
    bad_calib = root / "calib_scaled.npz"
    np.savez(bad_calib, x=(x * 0.02).astype(np.float32))
    # (INT8 required: on this small CNN an INT8 graph is slower than FP32, and a default build would ship FP32).
    # The build holds its budget on --val, where the fallback would put every clipped layer back in FP32; with
    # the budget and the verdict's limits loosened until they hold nothing back, it ships what the bad
    # calibration made, and the release gate is what must catch it
    out["broken_int8"] = _build(model, x, root / "broken_int8", val=val, precision="int8", calibration=bad_calib,
                                require_precision=True, max_drift="sqnr_db=-100",
                                thresholds={"min_mean_cosine": -1.0}).output_dir
    out["extra_work"] = _build(WithExtraWork(model).eval(), x, root / "extra_work", val=val).output_dir
    return out


def test_identical_candidate_passes_20_times_out_of_20(builds):
    failures, lowers = [], []
    for _ in range(IDENTICAL_RUNS):
        result = infopt.gate(builds["identical"], builds["baseline"], val=builds["val"], memory=False)
        lowers += [e["lower"] for e in result.measurements["latency"]["estimates"]]
        if not result.passed:
            failures.append(result.reasons)
    assert failures == [], f"{len(failures)}/{IDENTICAL_RUNS} false failures: {failures}"
    task = result.measurements["task"]
    assert task["candidate"] == task["baseline"] and task["drop"] == 0
    assert result.measurements["drift"]["baseline"]["worst"]["max_abs"] == 0.0
    assert max(lowers) <= 1.10


def test_identical_candidate_through_the_cli_writes_junit_summary_and_json(builds, tmp_path, monkeypatch):
    step_summary = tmp_path / "step_summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    junit, summary = tmp_path / "gate.xml", tmp_path / "gate.md"
    proc = run_cli("gate", str(builds["identical"] / "manifest.json"), "--baseline", str(builds["baseline"]),
                   "--val", str(builds["val"]), "--junit", str(junit), "--summary", str(summary), "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["passed"] is True and result["reasons"] == []
    groups = {c["group"] for c in result["checks"]}
    assert {"build", "reference", "baseline", "task", "latency", "size", "memory"} <= groups
    memory = result["measurements"]["memory"]
    assert memory["candidate"]["peak_rss_bytes"] > 0 and memory["baseline"]["peak_rss_bytes"] > 0
    assert result["measurements"]["size"]["ratio"] == 1.0
    suite = ET.parse(junit).getroot().find("testsuite")
    assert int(suite.get("tests")) == len(result["checks"]) and suite.get("failures") == "0"
    assert suite.find("testcase/failure") is None
    text = summary.read_text()
    assert "infopt gate: PASS" in text and "| task: accuracy |" in text
    assert step_summary.read_text() == "earlier step\n" + text


def _gate_json(candidate, baseline, *args):
    proc = run_cli("gate", str(candidate), "--baseline", str(baseline), "--json", "--no-memory", *args)
    return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None)


def test_broken_quantization_fails_on_its_task(builds, tmp_path):
    junit = tmp_path / "gate.xml"
    proc, result = _gate_json(builds["broken_int8"], builds["baseline"], "--val", str(builds["val"]), "--junit", str(junit))
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = {(c["group"], c["name"]) for c in result["checks"] if c["passed"] is False}
    # on its task, and on agreement with the baseline (its own loosened limits against the source pass)
    assert ("task", "accuracy") in failed and ("baseline", "min_top1") in failed
    task = result["measurements"]["task"]
    assert task["baseline"] >= 0.95 and task["drop"] > 0.5
    messages = [f.get("message") for f in ET.parse(junit).getroot().iter("failure")]
    assert any(m.startswith("task accuracy") for m in messages)


def test_model_that_does_extra_work_fails_on_latency_alone(builds):
    proc, result = _gate_json(builds["extra_work"], builds["baseline"], "--val", str(builds["val"]))
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = {c["group"] for c in result["checks"] if c["passed"] is False}
    assert failed == {"latency"}
    assert all(e["lower"] > 1.10 for e in result["measurements"]["latency"]["estimates"])
    task = result["measurements"]["task"]
    assert task["candidate"] == task["baseline"]  # the extra work leaves every prediction as it was


def test_retrained_model_is_judged_on_its_task_not_on_matching_its_predecessor(builds, digits):
    """Another training run of the same network disagrees with the baseline on some samples, yet is
    as accurate: the default gate passes it, and a gate on agreement with the baseline would not."""
    (xtr, ytr), _ = digits_data(0)
    torch.manual_seed(1)
    retrained = fit(DigitsCNN(), torch.from_numpy(xtr), torch.from_numpy(ytr), 15, 3e-3, seed=1)
    _, data = digits
    out = _build(retrained, data["val"][0], builds["root"] / "retrained", val=builds["val"]).output_dir
    result = infopt.gate(out, builds["baseline"], val=builds["val"], memory=False)
    agreement = result.measurements["drift"]["baseline"]["worst"]["top1"]
    assert agreement < 1.0
    assert result.passed, result.reasons
    strict = infopt.gate(out, builds["baseline"], val=builds["val"], memory=False, config=GateConfig(baseline={"min_top1": 1.0}))
    assert not strict.passed and [c.group for c in strict.checks if c.passed is False] == ["baseline"]


def test_baseline_of_another_model_is_refused(builds, files, tmp_path):
    other = tmp_path / "encoder"
    proc = run_cli("build", str(files / "encoder.pt2"), "--val", str(files / "encoder_val.npz"), "--output", str(other),
                   "--backend", "onnxruntime", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc, _ = _gate_json(builds["identical"], other)
    assert proc.returncode == 2
    assert "is another model than the candidate" in proc.stderr and "inputs x vs input_ids" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupted_candidate_is_refused_and_named(builds, tmp_path):
    broken = tmp_path / "corrupted"
    shutil.copytree(builds["identical"], broken)
    model = broken / "model" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    proc, _ = _gate_json(broken, builds["baseline"])
    assert proc.returncode == 2
    assert "does not match its manifest: model/model.onnx: sha256 differs" in proc.stderr
    assert f"infopt verify {broken}" in proc.stderr and "Traceback" not in proc.stderr


def test_gate_file_with_an_unknown_key_is_refused(builds, tmp_path):
    gate_file = tmp_path / "gate.yaml"
    gate_file.write_text("latency:\n  max_ratio: 1.2\n  max_p99: 5\n")
    proc, _ = _gate_json(builds["identical"], builds["baseline"], "--gate-file", str(gate_file))
    assert proc.returncode == 2
    assert "unknown key 'latency.max_p99'" in proc.stderr and "max_ratio, confidence" in proc.stderr


def test_task_metric_without_labels_is_refused(builds, tmp_path):
    unlabelled = tmp_path / "val.npz"
    with np.load(builds["val"]) as data:
        np.savez(unlabelled, x=data["x"])
    proc, _ = _gate_json(builds["identical"], builds["baseline"], "--val", str(unlabelled), "--task-metric", "top3")
    assert proc.returncode == 2
    assert "task metric top3 needs labels" in proc.stderr and "'labels'" in proc.stderr


def test_same_source_candidate_is_held_to_the_baseline_without_labels(builds):
    """No labels, no limits given: a broken INT8 build of the same model is held to its recipe's drift
    limits and top-1 agreement with the baseline, instead of passing silently."""
    proc, result = _gate_json(builds["broken_int8"], builds["baseline"], "--trials", "5")
    assert proc.returncode == 1, proc.stderr[-2000:]
    failed = {(c["group"], c["name"]) for c in result["checks"] if c["passed"] is False}
    assert ("baseline", "min_top1") in failed
    assert any("same source model" in n for n in result["notes"])
    identical = infopt.gate(builds["identical"], builds["baseline"], memory=False, config=GateConfig(latency={"trials": 5}))
    assert identical.passed and any(c.group == "baseline" and c.name == "min_top1" and c.passed for c in identical.checks)


def test_different_source_without_labels_says_accuracy_was_not_gated(builds, tmp_path):
    junit, summary = tmp_path / "gate.xml", tmp_path / "gate.md"
    proc, result = _gate_json(builds["extra_work"], builds["baseline"], "--max-latency-ratio", "1000", "--trials", "5",
                              "--junit", str(junit), "--summary", str(summary))
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = [c for c in result["checks"] if c["skipped"]]
    assert [(c["group"], c["passed"]) for c in skipped] == [("accuracy", None)]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("skipped") == "1" and "ACCURACY WAS NOT GATED" in suite.find("testcase/skipped").get("message")
    text = summary.read_text()
    assert "**SKIPPED**" in text and "accuracy was not gated" in text
