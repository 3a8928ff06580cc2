"""TorchServe: the archive torch-model-archiver writes, and a real TorchServe serving it.

The server tests build the digits CNN, write its model store, and start ``torchserve`` (Java
frontend, Python worker) on loopback with the written ``config.properties`` moved to free ports.
The server's pid file, worker sockets and logs live in the test's own temporary folder, and the
server is stopped, its whole process group killed and checked gone, whatever the test's outcome.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from infopt.core.errors import EnvironmentProblem, UsageError
from infopt.core.manifest import read_manifest
from infopt.core.manifest_schema import Manifest
from infopt.exporters.servers.torchserve import DEFAULT_PORTS, HANDLER, write_torchserve
from infopt.runtime.serving.torchserve_server import TorchServeEndpoints, serving
from tests.support.manifests import typed_manifest
from tests.support.served import bounded_load, session_processes

HAS_ARCHIVER = importlib.util.find_spec("model_archiver") is not None
TORCHSERVE = Path(sys.executable).with_name("torchserve")

needs_archiver = pytest.mark.skipif(not HAS_ARCHIVER, reason="torch-model-archiver is not installed "
                                    "(pip install torch-model-archiver)")


def _server_missing() -> str | None:
    if shutil.which("java") is None:
        return "java is not installed: TorchServe's frontend is a Java program"
    if not HAS_ARCHIVER or not TORCHSERVE.exists():
        return "torchserve and torch-model-archiver are not installed (pip install torchserve torch-model-archiver)"
    return None


needs_server = pytest.mark.skipif(_server_missing() is not None, reason=_server_missing() or "")


def two_input_manifest(batched_output: bool = True) -> Manifest:
    return typed_manifest(
        inputs={"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 3]},
                           {"name": "ids", "dtype": "int64", "shape": ["batch", "seq"]}],
                "dims": {"batch": {"min": 1, "opt": 4, "max": 16}, "seq": {"min": 2, "opt": 8, "max": 32}}},
        outputs=[{"name": "y", "dtype": "float32", "shape": ["batch", 2] if batched_output else [2]}])


def read_mar(path: Path) -> dict[str, bytes]:
    assert zipfile.is_zipfile(path)
    with zipfile.ZipFile(path) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


# ---- the archive --------------------------------------------------------------------------------

def test_moved_ports_give_each_server_its_own_ports_and_worker_sockets():
    from infopt.runtime.serving.torchserve_server import moved_ports

    written = "inference_address=http://127.0.0.1:8080\nmanagement_address=http://127.0.0.1:8081\n" \
              "metrics_address=http://127.0.0.1:8082\ngrpc_inference_port=7070\ngrpc_management_port=7071\n"
    text, ports = moved_ports(written, first_http_port=20000)
    assert properties(text) == {"inference_address": "http://127.0.0.1:20000",
                                "management_address": "http://127.0.0.1:20001",
                                "metrics_address": "http://127.0.0.1:20002", "grpc_inference_port": "20003",
                                "grpc_management_port": "20004", "initial_worker_port": "20005"}
    # free ports where none is given: two servers never share the workers' default 9000 (their socket names)
    firsts = {properties(moved_ports(written)[0])["initial_worker_port"] for _ in range(3)}
    assert "9000" not in firsts
    assert properties(moved_ports(text)[0])["initial_worker_port"] != "20005"  # an existing one is moved too


@needs_archiver
def test_onnx_archive_holds_handler_model_sidecar_and_io(tmp_path):
    model = tmp_path / "built, v[1]" / "model.onnx"  # the archiver splits on commas and globs [..]
    model.parent.mkdir()
    model.write_bytes(b"onnx graph bytes")
    (model.parent / "model.onnx.data").write_bytes(b"external weights")
    folder = tmp_path / "servers" / "torchserve"
    mar = write_torchserve(folder, "enc", model, two_input_manifest())

    assert mar == folder / "model-store" / "enc.mar"
    files = read_mar(mar)
    assert set(files) == {"infopt_handler.py", "model.onnx", "model.onnx.data", "infopt_io.json",
                          "model-config.yaml", "MAR-INF/MANIFEST.json"}
    with zipfile.ZipFile(mar) as archive:  # stored, not deflated: weights barely compress, and deflate is slow
        assert {info.compress_type for info in archive.infolist()} == {zipfile.ZIP_STORED}
    assert files["model.onnx"] == b"onnx graph bytes" and files["model.onnx.data"] == b"external weights"
    assert files["infopt_handler.py"].decode() == HANDLER
    compile(HANDLER, "infopt_handler.py", "exec")

    manifest = json.loads(files["MAR-INF/MANIFEST.json"])
    assert manifest["runtime"] == "python"
    assert manifest["model"]["modelName"] == "enc"
    assert manifest["model"]["handler"] == "infopt_handler.py"
    assert manifest["model"]["serializedFile"] == "model.onnx"
    assert manifest["model"]["configFile"] == "model-config.yaml"

    io = json.loads(files["infopt_io.json"])
    assert io["model_file"] == "model.onnx" and io["format"] == "onnx" and io["device"] == "cpu"
    assert [(t["name"], t["dtype"], t["shape"]) for t in io["inputs"]] == [("x", "float32", ["batch", 3]),
                                                                          ("ids", "int64", ["batch", "seq"])]
    assert [(t["name"], t["dtype"]) for t in io["outputs"]] == [("y", "float32")]
    assert io["batch"] == "batch" and io["max_batch"] == 16 and io["dims"]["seq"] == {"min": 2, "opt": 8, "max": 32}

    settings = dict(line.split(": ") for line in files["model-config.yaml"].decode().splitlines())
    assert settings["batchSize"] == "8" and int(settings["maxBatchDelay"]) > 0 and settings["maxWorkers"] == "1"

    config = properties((folder / "config.properties").read_text())
    assert config["inference_address"] == f"http://127.0.0.1:{DEFAULT_PORTS['inference']}"
    assert config["management_address"] == f"http://127.0.0.1:{DEFAULT_PORTS['management']}"
    assert config["metrics_address"] == f"http://127.0.0.1:{DEFAULT_PORTS['metrics']}"
    assert config["grpc_inference_address"] == config["grpc_management_address"] == "127.0.0.1"
    assert config["model_store"] == "model-store" and config["load_models"] == "enc.mar"
    assert config["disable_token_authorization"] == "true"


@needs_archiver
def test_pt2_archive_and_unbatched_outputs(tmp_path):
    package = tmp_path / "model.pt2"
    package.write_bytes(b"aoti package")
    (tmp_path / "model.pt2.data").write_bytes(b"not a sidecar of a .pt2")
    mar = write_torchserve(tmp_path / "ts", "lin-1.0", package, two_input_manifest(batched_output=False))
    files = read_mar(mar)
    assert "model.pt2.data" not in files and files["model.pt2"] == b"aoti package"
    assert json.loads(files["MAR-INF/MANIFEST.json"])["model"]["serializedFile"] == "model.pt2"
    io = json.loads(files["infopt_io.json"])
    assert io["format"] == "aoti" and io["batch"] is None and io["max_batch"] is None
    assert "batchSize: 1\n" in files["model-config.yaml"].decode()


@needs_archiver
def test_refusals_are_usage_errors(tmp_path):
    for model_name, name in (("model.plan", "m"), ("model.pt", "m"), ("model.onnx", "bad name!"), ("missing.onnx", "m")):
        model = tmp_path / model_name
        if model_name != "missing.onnx":
            model.write_bytes(b"x")
        with pytest.raises(UsageError) as caught:
            write_torchserve(tmp_path / "ts", name, model, two_input_manifest())
        assert caught.value.exit_code == 2
        if model_name == "model.plan":
            assert "TensorRT" in caught.value.what and "Triton" in caught.value.fix
    assert not (tmp_path / "ts" / "config.properties").exists()


def test_missing_archiver_is_an_environment_problem(tmp_path, monkeypatch):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "model_archiver", None)  # how Python spells "not importable"
    with pytest.raises(EnvironmentProblem) as caught:
        write_torchserve(tmp_path / "ts", "m", model, two_input_manifest())
    assert caught.value.exit_code == 4 and caught.value.fix == "pip install torch-model-archiver"


# ---- a real server ------------------------------------------------------------------------------

def request(url: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@contextlib.contextmanager
def torchserve(folder: Path, name: str, tmp: Path) -> Iterator[TorchServeEndpoints]:
    """The written config with free ports, served from ``folder`` by infopt's launcher (what ``infopt serve``
    runs); afterwards every process of the server's session is gone."""
    with serving(folder, name, tmp) as server:
        sid = server.process.pid
        yield server
    deadline = time.monotonic() + 20
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_processes(sid), "TorchServe processes were left running"


def build_digits(tmp_path_factory, digits, backend: str) -> tuple[Path, Manifest]:
    import infopt

    model, data = digits
    x = torch.from_numpy(data["val"][0][:8])
    out = tmp_path_factory.mktemp(f"digits-{backend}") / "dist"
    infopt.build(model, example_inputs=(x,), target="cpu", backend=backend, name="digits", output=out, progress=False)
    return out, read_manifest(out)


def eager(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


def predict(server: TorchServeEndpoints, name: str, x: np.ndarray) -> np.ndarray:
    status, answer = request(f"{server.inference}/predictions/{name}", {"inputs": {"x": x.tolist()}})
    assert status == 200, answer
    return np.asarray(answer["outputs"]["output"], dtype=np.float32)


def check_bad_requests(server: TorchServeEndpoints, name: str, x: np.ndarray) -> None:
    url = f"{server.inference}/predictions/{name}"
    status, answer = request(url, {"inputs": {"image": x.tolist()}})
    assert status == 400 and "missing input x" in answer["error"] and "unknown input image" in answer["error"]
    status, answer = request(url, {"inputs": {"x": [[["a"] * 8] * 8]}})
    assert status == 400 and "input x" in answer["error"] and "float32" in answer["error"]
    status, answer = request(url, {"inputs": {"x": x[:, :, :4].tolist()}})
    assert status == 400 and "axis 2" in answer["error"] and "expected 8" in answer["error"]
    status, answer = request(url, b"{not json")
    assert status == 400 and "not JSON" in answer["error"]


@pytest.fixture(scope="module")
def digits_onnx(tmp_path_factory, digits):
    return build_digits(tmp_path_factory, digits, "onnxruntime")


@needs_server
@pytest.mark.slow
def test_torchserve_serves_the_onnx_model(digits, digits_onnx, tmp_path):
    model, data = digits
    x = data["val"][0][:32]
    reference = eager(model, x)
    dist, manifest = digits_onnx
    # the built model with its weights moved to an external-data sidecar, which must travel with it
    onnx = pytest.importorskip("onnx")
    model_file = tmp_path / "external" / "model.onnx"
    model_file.parent.mkdir()
    onnx.save(onnx.load(str(dist / "model" / "model.onnx")), str(model_file), save_as_external_data=True,
              location="model.onnx.data", size_threshold=1024)
    assert model_file.with_name("model.onnx.data").stat().st_size > 10_000
    folder = tmp_path / "torchserve"  # the build's own folder stays as built: other tests serve it
    mar = write_torchserve(folder, "digits", model_file, manifest)
    assert {"model.onnx", "model.onnx.data"} <= set(read_mar(mar))

    with torchserve(folder, "digits", tmp_path) as server:
        status, health = request(f"{server.inference}/ping")
        assert status == 200 and health["status"] == "Healthy"
        np.testing.assert_allclose(predict(server, "digits", x), reference, atol=1e-4)

        v2 = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        status, answer = request(f"{server.inference}/predictions/digits", v2)
        assert status == 200 and answer["model_name"] == "digits"
        (output,) = answer["outputs"]
        assert output["name"] == "output" and output["shape"] == [32, 10] and output["datatype"] == "FP32"
        np.testing.assert_allclose(np.reshape(output["data"], (32, 10)), reference, atol=1e-4)

        check_bad_requests(server, "digits", x)

        # concurrent single-row requests, one of them bad: TorchServe hands the worker batches of
        # requests; each must get its own row's answer, the bad one its own error
        bodies = [{"inputs": {"x": x[i:i + 1].tolist()}} for i in range(len(x))] + [{"inputs": {"y": x[:1].tolist()}}]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda b: request(f"{server.inference}/predictions/digits", b), bodies))
        for i, (status, answer) in enumerate(answers[:-1]):
            assert status == 200, answer
            np.testing.assert_allclose(np.asarray(answer["outputs"]["output"]), reference[i:i + 1], atol=1e-4)
        assert answers[-1][0] == 400 and "missing input x" in answers[-1][1]["error"]
        sizes = [int(n) for n in re.findall(r"batch of (\d+) requests", (server.logs / "model_log.log").read_text())]
        assert max(sizes) > 1, f"the worker never got more than one request at a time: {sizes}"

        # more rows than the batch dim's max (64) run in chunks; the worker lived through the bad requests
        assert manifest.inputs.dims["batch"].max < 100
        big = data["val"][0][:100]
        np.testing.assert_allclose(predict(server, "digits", big), eager(model, big), atol=1e-4)

        # a bounded load: 8 clients for 2 s, every answer checked
        load = bounded_load(f"{server.inference}/predictions/digits", model, data["val"][0], seconds=2.0)
        assert load.failed == 0 and load.wrong == 0, load.errors
        assert load.requests >= 8, load

        # a second server of the same folder beside it: its workers' sockets are its own
        with torchserve(folder, "digits", tmp_path / "second") as second:
            np.testing.assert_allclose(predict(second, "digits", x), reference, atol=1e-4)
            np.testing.assert_allclose(predict(server, "digits", x), reference, atol=1e-4)


@needs_server
@pytest.mark.slow
@pytest.mark.xdist_group("digits-aoti")  # the build is shared with the Triton tests
def test_torchserve_serves_an_aoti_package(digits, digits_aoti, tmp_path):
    model, data = digits
    x = data["val"][0][:16]
    dist = tmp_path / "dist"
    shutil.copytree(digits_aoti, dist)
    manifest = read_manifest(dist)
    folder = dist / "servers" / "torchserve"
    write_torchserve(folder, "digits", dist / "model" / "model.pt2", manifest)

    with torchserve(folder, "digits", tmp_path) as server:
        np.testing.assert_allclose(predict(server, "digits", x), eager(model, x), atol=1e-4)
        np.testing.assert_allclose(predict(server, "digits", x[5:6]), eager(model, x[5:6]), atol=1e-4)
        check_bad_requests(server, "digits", x)


@needs_server
@pytest.mark.slow
def test_infopt_serve_starts_torchserve_for_an_onnx_build_and_stops_on_ctrl_c(digits, digits_onnx):
    """``infopt serve DIST``: an ONNX build goes to TorchServe (the bundled Triton has no ONNX Runtime backend)."""
    from tests.support.served import serve_and_ask

    model, _ = digits
    dist, _ = digits_onnx
    reply, printed, code = serve_and_ask(dist)
    assert code == 0, printed[-3000:]
    assert "with TorchServe on http://127.0.0.1:" in printed and "stopped" in printed
    (output,) = reply["outputs"]
    np.testing.assert_allclose(np.asarray(output["data"], np.float32).reshape(1, 10),
                               eager(model, np.zeros((1, 1, 8, 8), np.float32)), atol=1e-4)
