"""Each bad input ends in a clear message, its documented exit code, no traceback and no output."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.bad_models import DataDependent
from tests.support.cli import assert_clean_failure, run_cli, run_cli_here


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
    proc = run_cli("build", str(tmp_path / "dd.pt"), "--model-class", "tests.support.bad_models:DataDependent",
                   "--input", "x:float32[batch,4]", "-o", str(out))
    assert_clean_failure(proc, 3, "data-dependent", "bad_models.py", "if y.mean() > 0", out=out)
    assert "def forward" not in proc.stderr  # torch.export prints the partial graph to stderr; infopt keeps it for -v


def test_dim_range_the_model_itself_cannot_take(tmp_path):
    """--dim seq up to 32 for a model with 16 positions: exit 2 before anything is written, naming the dims."""
    from tests.support.bad_models import LearnedPositions

    torch.save(LearnedPositions().state_dict(), tmp_path / "pos.pt")
    proc = run_cli("build", "pos.pt", "--model-class", "tests.support.bad_models:LearnedPositions",
                   "--input", "x:float32[batch,seq,8]", "--dim", "seq=1:8:32", cwd=tmp_path)
    assert_clean_failure(proc, 2, "the model itself fails at", "seq=32", "--dim", out=tmp_path / "dist" / "pos")
    ok = run_cli("build", "pos.pt", "--model-class", "tests.support.bad_models:LearnedPositions", "--backend", "onnxruntime",
                 "--input", "x:float32[batch,seq,8]", "--dim", "seq=1:8:16", "--dim", "batch=1:4:16", "--batch-sizes", "1", "-q",
                 cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    notes = json.loads((tmp_path / "dist" / "pos" / "manifest.json").read_text())["validation"]["notes"]
    assert "ran at the ends of its dim ranges (batch=1, seq=1; batch=1, seq=16; batch=16, seq=1)" in " ".join(notes)


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


# ---------------------------------------------------------------------------------------------------
# The table: every command, as a user types it (relative paths, in a folder of their own), through the
# CLI's entry point in this process (the cases above start the installed command). Each case
# asserts its exit code, a message naming the problem, no traceback, and nothing written beside the
# inputs: no dist/ folder, no temporary sibling, no lock file.

def _save_from_main(path: Path) -> None:
    """A whole module pickled from a class the saving script defined (``__main__.Ghost``), gone once saved."""
    import sys

    main = sys.modules["__main__"]
    ghost = type("Ghost", (torch.nn.Linear,), {"__module__": "__main__"})
    main.Ghost = ghost
    try:
        torch.save(ghost(4, 3), path)
    finally:
        del main.Ghost


def _public_key_pem() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.PEM,
                                                                  serialization.PublicFormat.SubjectPublicKeyInfo)


def _workspace(folder: Path) -> None:
    """The files the table's commands name: a TorchScript, a state dict, an ONNX model, samples, junk."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tests.support.payloads import Tiny

    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(folder / "tiny.pt"))
    torch.save(Tiny().state_dict(), folder / "sd.pt")
    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "tiny.onnx"))
    np.savez(folder / "v.npz", x=np.random.RandomState(0).randn(8, 4).astype(np.float32))
    np.savez(folder / "wrong_name.npz", y=np.zeros((8, 4), np.float32), z=np.zeros((8, 4), np.float32))
    np.savez(folder / "wrong_shape.npz", x=np.zeros((8, 5), np.float32))
    (folder / "s.txt").write_text("a sentence\n")
    (folder / "empty.pt").write_bytes(b"")
    _save_from_main(folder / "main.pt")
    (folder / "noise.pt").write_bytes(bytes(range(256)) * 4)
    with zipfile.ZipFile(folder / "notmodel.pt", "w") as archive:
        archive.writestr("readme.txt", "hello")
    (folder / "notes").mkdir()
    (folder / "notes" / "todo.txt").write_text("mine")
    (folder / "afile").write_text("x")
    (folder / "bad.yaml").write_text("name: [unclosed\n")
    (folder / "twice.yaml").write_text("name: mine\nbackend: onnxruntime\nprecision: fp32\npasses:\n  - name: onnx_export\n"
                                       "    options:\n      opset: 17\n      opset: 18\n")
    (folder / "gate_bad_key.yaml").write_text("latency:\n  max_ratoi: 1.1\n")
    (folder / "junk.pem").write_text("not a key\n")
    (folder / "public.pem").write_bytes(_public_key_pem())
    (folder / "nomanifest").mkdir()
    (folder / "badjson").mkdir()
    (folder / "badjson" / "manifest.json").write_text("{not json")


TS = ["tiny.pt", "--input", "x:float32[batch,4]"]
D = "{dist}"

TABLE = [
    # typer/click usage errors, in infopt's form
    ("build: no model", ["build"], 2, "Missing argument 'model'"),
    ("build: unknown option", ["build", *TS, "--nope"], 2, "No such option: --nope"),
    ("unknown command", ["bild"], 2, "No such command 'bild'"),
    ("build: option without its value", ["build", *TS, "--target"], 2, "requires an argument"),
    ("build: not an integer", ["build", *TS, "--calib-samples", "abc"], 2, "Invalid value for '--calib-samples'"),
    ("build: group size not an integer", ["build", *TS, "--group-size", "x"], 2, "Invalid value for '--group-size'"),
    ("gate: no baseline", ["gate", D], 2, "Missing option '--baseline'"),
    ("gate: trials not an integer", ["gate", D, "-b", D, "--trials", "x"], 2, "Invalid value for '--trials'"),
    ("validate: no folder", ["validate"], 2, "Missing argument"),
    ("verify: no folder", ["verify"], 2, "Missing argument"),
    ("inspect: no model", ["inspect"], 2, "Missing argument"),
    ("sign: no key", ["sign", D], 2, "Missing option '--key'"),
    # build options
    ("build: unknown target", ["build", *TS, "--target", "h1000"], 2, "unknown target"),
    ("build: unknown precision", ["build", *TS, "--precision", "fp7"], 2, "fp7"),
    ("build: two precisions", ["build", *TS, "--fp16", "--int8"], 2, "more than one precision"),
    ("build: unknown backend", ["build", *TS, "--backend", "tvm"], 2, "tvm"),
    ("build: batch size 0", ["build", *TS, "--batch-sizes", "0"], 2, "--batch-sizes"),
    ("build: batch mix with a zero share", ["build", *TS, "--batch-mix", "1:0.5,32:0"], 2, "share above 0"),
    ("build: batch mix not BATCH:SHARE", ["build", *TS, "--batch-mix", "one:half"], 2, "is not BATCH:SHARE"),
    ("build: batch mix against other --batch-sizes", ["build", *TS, "--batch-mix", "1:0.7,8:0.3", "--batch-sizes", "1,4"],
     2, "the mix's sizes are the ones timed"),
    ("build: dim range backwards", ["build", *TS, "--dim", "batch=8:4:1"], 2, "batch"),
    ("build: dim not name=min:opt:max", ["build", *TS, "--dim", "nonsense"], 2, "nonsense"),
    ("build: unknown dtype", ["build", "tiny.pt", "--input", "x:float99[batch,4]"], 2, "float99"),
    ("build: dim not in the spec", ["build", *TS, "--dim", "seq=1:2:4"], 2, "seq"),
    ("build: model args not JSON", ["build", "sd.pt", "--model-class", "tests.support.payloads:Tiny", "--model-args", "{bad",
                                    "--input", "x:float32[batch,4]"], 2, "--model-args is not valid JSON"),
    ("build: model class without colon", ["build", "sd.pt", "--model-class", "Tiny", "--input", "x:float32[batch,4]"], 2,
     "pkg.module:Class"),
    ("build: model class not importable", ["build", "sd.pt", "--model-class", "no_such_pkg.m:Net", "--input",
                                           "x:float32[batch,4]"], 2, "cannot import"),
    ("build: pickled module of a class from the saving script", ["build", "main.pt", "--allow-pickle", "--input",
                                                                "x:float32[batch,4]"], 2, "__main__.Ghost cannot be imported"),
    ("build: state dict without class", ["build", "sd.pt", "--input", "x:float32[batch,4]"], 2, "--model-class"),
    ("build: state dict for another class", ["build", "sd.pt", "--model-class", "examples.models:DigitsCNN",
                                             "--input", "x:float32[batch,4]"], 2, "does not fit"),
    ("build: unknown calibration method", ["build", *TS, "--int8", "--calib", "v.npz", "--calib-method", "magic"], 2, "--calib-method"),
    ("build: unknown INT4 method", ["build", *TS, "--int4", "--int4-method", "magic"], 2, "--int4-method"),
    ("build: a GPTQ setting when RTN is chosen", ["build", *TS, "--int4", "--act-order"], 2,
     "act_order is a setting of GPTQ"),
    ("build: unknown INT4 checkpoint", ["build", *TS, "--int4", "--int4-checkpoint", "magic"], 2, "--int4-checkpoint"),
    ("build: drift budget not METRIC=VALUE", ["build", *TS, "--int8", "--max-drift", "tight"], 2, "drift budget 'tight'"),
    ("build: unknown recipe", ["build", *TS, "--recipe", "no-such-recipe"], 2, "no-such-recipe"),
    ("build: recipe not YAML", ["build", *TS, "--recipe", "bad.yaml"], 2, "not valid YAML"),
    ("build: a recipe key written twice", ["build", *TS, "--recipe", "twice.yaml"], 2,
     "the key 'opset' is written twice in one mapping (first on line 7)"),
    ("build: validation data missing", ["build", *TS, "--val", "missing.npz"], 2, "missing.npz"),
    ("build: validation data a text file", ["build", *TS, "--val", "s.txt"], 2, "s.txt"),
    ("build: validation data another input", ["build", *TS, "--val", "wrong_name.npz"], 2, "wrong_name.npz"),
    ("build: validation data another shape", ["build", *TS, "--val", "wrong_shape.npz"], 2, "wrong_shape.npz"),
    ("build: calibration data missing", ["build", *TS, "--int8", "--calib", "missing.npz"], 2, "missing.npz"),
    ("build: --output .", ["build", *TS, "--output", ".", "--force"], 2, "current folder"),
    ("build: --output ..", ["build", *TS, "--output", "..", "--force"], 2, "current folder"),
    ("build: name too long", ["build", *TS, "--name", "m" * 230], 2, "at most 200"),
    ("build: output name too long", ["build", *TS, "--output", "dist/" + "m" * 240], 2, "at most 200"),
    ("build: --force onto a user's folder", ["build", *TS, "--output", "notes", "--force"], 2, "not an infopt output"),
    ("build: output is a file", ["build", *TS, "--output", "afile", "--force"], 2, "not a folder"),
    ("build: model missing", ["build", "missing.pt", "--input", "x:float32[batch,4]"], 2, "not found"),
    ("build: a mistyped path that reads as org/name", ["build", "notes/nope.pt"], 2, "model file not found: notes/nope.pt"),
    ("build: a missing model file in a folder of that name", ["build", "fx/nope.pt"], 2, "model file not found: fx/nope.pt"),
    ("build: drift limit not a number", ["build", *TS, "--max-abs", "nan"], 2, "--max-abs nan"),
    ("build: drift limit infinite", ["build", *TS, "--min-sqnr-db", "inf"], 2, "--min-sqnr-db inf"),
    ("build: drift limit negative", ["build", *TS, "--max-abs", "-1"], 2, "--max-abs -1.0"),
    ("build: cosine limit above 1", ["build", *TS, "--min-cosine", "1.5"], 2, "--min-cosine 1.5"),
    ("build: latency limit not a number", ["build", *TS, "--max-p99-ms", "nan"], 2, "--max-p99-ms nan"),
    ("build: model empty", ["build", "empty.pt", "--input", "x:float32[batch,4]"], 2, "empty"),
    ("build: model is noise", ["build", "noise.pt", "--input", "x:float32[batch,4]"], 2, "not a model file"),
    ("build: zip that is no model", ["build", "notmodel.pt", "--input", "x:float32[batch,4]"], 2, "not a PyTorch or ONNX model"),
    ("build: folder that is no model", ["build", "notes"], 2, "not a Hugging Face model folder"),
    ("build: ONNX inputs named otherwise", ["build", "tiny.onnx", "--input", "z:float32[batch,4]"], 2, "the spec names z"),
    ("build: ONNX input of another rank", ["build", "tiny.onnx", "--input", "x:float32[batch,4,2]"], 2, "rank"),
    # inspect
    ("inspect: model missing", ["inspect", "missing.pt"], 2, "not found"),
    ("inspect: a mistyped path that reads as org/name", ["inspect", "notes/nope.pt"], 2, "model file not found"),
    ("validate: drift limit not a number", ["validate", D, "--min-cosine", "nan"], 2, "--min-cosine nan"),
    ("inspect: no input spec", ["inspect", "tiny.pt"], 2, "--input"),
    ("inspect: ONNX input of another rank", ["inspect", "tiny.onnx", "--input", "x:float32[batch,4,2]"], 2, "rank"),
    ("inspect: TorchScript input of another width", ["inspect", "tiny.pt", "--input", "x:float32[batch,5]"], 2, "forward fails"),
    # validate, verify, sign
    ("validate: folder missing", ["validate", "nowhere"], 2, "nowhere"),
    ("validate: no manifest", ["validate", "nomanifest"], 2, "no manifest.json"),
    ("validate: manifest not JSON", ["validate", "badjson"], 2, "not valid JSON"),
    ("verify: folder missing", ["verify", "nowhere"], 2, "nowhere"),
    ("verify: no manifest", ["verify", "nomanifest"], 2, "no manifest.json"),
    ("verify: key not a key", ["verify", D, "--key", "junk.pem"], 2, "not an Ed25519 public"),
    ("sign: key missing", ["sign", D, "--key", "missing.pem"], 2, "cannot read the key"),
    ("sign: no manifest", ["sign", "nomanifest", "--key", "junk.pem"], 2, "no manifest.json"),
    # gate
    ("gate: candidate missing", ["gate", "nowhere", "-b", D], 2, "does not exist"),
    ("gate: baseline without manifest", ["gate", D, "-b", "nomanifest"], 2, "no manifest.json"),
    ("gate: JUnit path unwritable", ["gate", D, "-b", D, "--junit", "afile/gate.xml"], 2, "cannot write --junit"),
    ("gate: JUnit path a folder", ["gate", D, "-b", D, "--junit", "notes"], 2, "it is a folder"),
    ("gate: summary path unwritable", ["gate", D, "-b", D, "--summary", "afile/gate.md"], 2, "cannot write --summary"),
    ("gate: gate file missing", ["gate", D, "-b", D, "--gate-file", "missing.yaml"], 2, "missing.yaml"),
    ("gate: gate file with a misspelt key", ["gate", D, "-b", D, "--gate-file", "gate_bad_key.yaml"], 2, "max_ratoi"),
    ("gate: unknown task metric", ["gate", D, "-b", D, "--task-metric", "bogus", "--no-memory"], 2,
     "unknown task metric 'bogus'"),
    ("gate: batch size outside the range", ["gate", D, "-b", D, "--batch-sizes", "9999", "--no-memory"], 2,
     "outside what both models take"),
    ("gate: validation data of another model", ["gate", D, "-b", D, "--val", "v.npz", "--no-memory"], 2, "v.npz"),
    # serve: what it would serve is checked before anything starts
    ("serve: a model file changed after the build", ["serve", "{tampered}"], 1,
     "does not match its manifest, so nothing was started: model/model.onnx"),
    ("serve: --key for a folder nobody signed", ["serve", D, "--key", "public.pem"], 1,
     "is not signed (no manifest.json.sig), so nothing was started"),
    ("serve: a port in use", ["serve", D, "--port", "{busy}"], 2, "is in use on 127.0.0.1"),
]


@contextlib.contextmanager
def _placeholders(folder: Path, args: list[str], dist: Path):
    """``{dist}``: the shared digits build; ``{tampered}``: a copy of it, its model one byte longer; ``{busy}``: a
    port something listens on for the case's length."""
    values = {"{dist}": str(dist)}
    if "{tampered}" in args:
        shutil.copytree(dist, folder / "tampered")
        with open(folder / "tampered" / "model" / "model.onnx", "ab") as model:
            model.write(b"\0")
        values["{tampered}"] = "tampered"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        if "{busy}" in args:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            values["{busy}"] = str(listener.getsockname()[1])
        yield [values.get(a, a) for a in args]


@pytest.mark.parametrize("case", TABLE, ids=[c[0] for c in TABLE])
def test_table(case, tmp_path, digits_dist):
    _, args, code, needle = case
    _workspace(tmp_path)
    with _placeholders(tmp_path, args, digits_dist) as given:
        before = sorted(p.name for p in tmp_path.iterdir())
        proc = run_cli_here(*given, cwd=tmp_path)
    assert proc.returncode == code, (proc.returncode, proc.stderr[-1500:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert "error" in proc.stderr and needle in proc.stderr, proc.stderr[-1500:]
    assert "  fix:" in proc.stderr, "no fix line"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"
    assert sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["todo.txt"]


def test_the_table_holds_at_least_sixty_cases():
    assert len(TABLE) >= 60
