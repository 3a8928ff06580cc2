"""Each bad input ends in a clear message, its documented exit code, no traceback and no output."""

from __future__ import annotations

import json

import pytest
import torch

from tests.bad_models import DataDependent
from tests.conftest import run_cli


def assert_clean_failure(proc, code: int, *needles: str, out=None):
    assert proc.returncode == code, (proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert "error" in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    if out is not None:
        assert not out.exists()
        assert not out.parent.exists() or not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_missing_file(tmp_path):
    out = tmp_path / "dist" / "m"
    assert_clean_failure(run_cli("build", str(tmp_path / "nope.pt"), "-o", str(out)), 2, "not found", out=out)


def test_truncated_file(files, tmp_path):
    data = (files / "cnn_ts.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 3])
    out = tmp_path / "m"
    assert_clean_failure(run_cli("build", str(tmp_path / "cut.pt"), "-o", str(out)), 2, "truncated", out=out)


def test_pickled_module_without_flag(files, tmp_path):
    out = tmp_path / "m"
    proc = run_cli("build", str(files / "cnn_pickled.pt"), "--input", "x:float32[batch,1,8,8]", "-o", str(out))
    assert_clean_failure(proc, 2, "--allow-pickle", "DigitsCNN", out=out)


def test_pickled_module_with_flag_builds(files, tmp_path):
    out = tmp_path / "m"
    proc = run_cli("build", str(files / "cnn_pickled.pt"), "--allow-pickle", "--input", "x:float32[batch,1,8,8]",
                   "--val", str(files / "digits_val.npz"), "--backend", "onnxruntime", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert (out / "model" / "model.onnx").is_file()


def test_malformed_input_spec(files, tmp_path):
    out = tmp_path / "m"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32(batch,1,8,8)", "-o", str(out))
    assert_clean_failure(proc, 2, "name:dtype[", out=out)


def test_forward_fails_on_spec(files, tmp_path):
    out = tmp_path / "m"
    proc = run_cli("build", str(files / "cnn_sd.pt"), "--model-class", "examples.models:DigitsCNN",
                   "--input", "x:float32[batch,1,12,12]", "-o", str(out))
    assert_clean_failure(proc, 2, "forward fails", "x:float32[batch,1,12,12]", out=out)


def test_capture_failure_data_dependent(tmp_path):
    torch.save(DataDependent().state_dict(), tmp_path / "dd.pt")
    out = tmp_path / "m"
    proc = run_cli("build", str(tmp_path / "dd.pt"), "--model-class", "tests.bad_models:DataDependent",
                   "--input", "x:float32[batch,4]", "-o", str(out))
    assert_clean_failure(proc, 3, "data-dependent", "bad_models.py", "if y.mean() > 0", out=out)


def test_dim_range_the_model_itself_cannot_take(tmp_path):
    """--dim seq up to 32 for a model with 16 positions: exit 2 before anything is written, naming the dims."""
    from tests.bad_models import LearnedPositions

    torch.save(LearnedPositions().state_dict(), tmp_path / "pos.pt")
    proc = run_cli("build", "pos.pt", "--model-class", "tests.bad_models:LearnedPositions",
                   "--input", "x:float32[batch,seq,8]", "--dim", "seq=1:8:32", cwd=tmp_path)
    assert_clean_failure(proc, 2, "the model itself fails at", "seq=32", "--dim", out=tmp_path / "dist" / "pos")
    ok = run_cli("build", "pos.pt", "--model-class", "tests.bad_models:LearnedPositions", "--backend", "onnxruntime",
                 "--input", "x:float32[batch,seq,8]", "--dim", "seq=1:8:16", "--batch-sizes", "1", "-q", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    notes = json.loads((tmp_path / "dist" / "pos" / "manifest.json").read_text())["validation"]["notes"]
    assert "ran at the ends of its dim ranges (batch=1, seq=1; batch=1, seq=16; batch=64, seq=8)" in " ".join(notes)


def test_unwritable_output(files, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", "-o", str(blocker / "m"))
    assert_clean_failure(proc, 2, "cannot write the output folder")


def test_existing_output_without_force(files, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", "-o", str(out))
    assert_clean_failure(proc, 2, "--force")
    assert (out / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("args, needle", [
    (["--target", "h1000"], "unknown target"),
    (["--target", "t4", "--bf16"], "does not run bf16"),
    (["--int8", "--fp16"], "more than one precision"),
    (["--batch-sizes", "1,x"], "--batch-sizes"),
])
def test_bad_options(files, tmp_path, args, needle):
    out = tmp_path / "m"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", *args, "-o", str(out))
    assert_clean_failure(proc, 2, needle, out=out)


def test_thread_cap_that_is_not_a_count(files, tmp_path):
    out = tmp_path / "m"
    proc = run_cli("build", str(files / "cnn_ts.pt"), "--input", "x:float32[batch,1,8,8]", "-o", str(out),
                   env={"INFOPT_THREADS": "two"})
    assert_clean_failure(proc, 2, "INFOPT_THREADS='two' is not a thread count", out=out)
