"""A real Triton Inference Server serving the repositories infopt writes, queried with ``tritonclient``.

The server is the ``tritonserver`` binary the ``nvidia-pytriton`` wheel ships (2.51, Python backend, on
this CPU), started by ``infopt.runtime.serving.triton_server.serving`` on loopback ports and always
stopped. It serves the AOTInductor Python-backend models of two builds: the digits CNN (float images,
a batch dim) and the token encoder (int64 ids, a dynamic sequence dim), in one repository.

Not served here: the ONNX Runtime backend's repositories (that backend is not in the binary; their
config is checked against Triton's schema in ``test_triton.py``, and the ONNX model itself runs in ONNX
Runtime in every build) and TensorRT plans (no GPU).
"""

from __future__ import annotations

import importlib.util
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

http = pytest.importorskip("tritonclient.http")
grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from infopt.runtime.serving.triton_server import serving  # noqa: E402
from tests.support.served import triton_missing  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(triton_missing() is not None, reason=triton_missing() or ""),
              pytest.mark.xdist_group("digits-aoti")]


@pytest.fixture(scope="module")
def served(digits, encoder, digits_aoti, tmp_path_factory):
    """(the running server's endpoints, the digits CNN, the encoder, the folder holding both builds) with both
    builds' Triton repositories."""
    import infopt
    from infopt.core.cache import cache_dir

    root = tmp_path_factory.mktemp("triton-server")
    cnn, _ = digits
    enc, _ = encoder
    # infopt's own Inductor cache, as builds use it: a fresh one recompiles the AOTI headers
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir("inductor")))
        infopt.build(enc, inputs=["input_ids:int64[batch,seq]"], backend="inductor", name="encoder",
                     dims=["batch=1:4:8", "seq=2:16:64"], batch_sizes=[1], output=root / "encoder", progress=False)
    shutil.copytree(digits_aoti, root / "digits")
    repository = root / "repository"
    for name in ("digits", "encoder"):
        shutil.copytree(root / name / "servers" / "triton" / name, repository / name)
    with serving(repository, root / "server", verbose=True) as endpoints:
        yield endpoints, cnn, enc, root
    from tests.support.served import session_processes

    assert not session_processes(endpoints.process.pid), "the server or a stub of its Python backend still runs"


def eager(model, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


def ask(client_module, url: str, model: str, name: str, x: np.ndarray, output: str = "output") -> np.ndarray:
    client = client_module.InferenceServerClient(url)
    inputs = [client_module.InferInput(name, list(x.shape), {np.float32: "FP32", np.int64: "INT64"}[x.dtype.type])]
    inputs[0].set_data_from_numpy(x)
    return client.infer(model, inputs).as_numpy(output)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_served_models_answer_what_eager_computes(served, digits, encoder, protocol):
    endpoints, cnn, enc, _ = served
    module, url = (http, endpoints.http) if protocol == "http" else (grpc, endpoints.grpc)
    images = digits[1]["val"][0]
    for batch in (1, 3, 16):
        x = np.ascontiguousarray(images[:batch])
        got = ask(module, url, "digits", "x", x)
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, eager(cnn, x), atol=1e-4)
    ids = encoder[1]["val"][0]
    for batch, seq in ((1, 2), (2, 16), (8, 64)):
        x = np.ascontiguousarray(np.resize(ids[:batch], (batch, seq)).astype(np.int64))
        got = ask(module, url, "encoder", "input_ids", x)
        assert got.shape == (batch, 2)
        np.testing.assert_allclose(got, eager(enc, x), atol=1e-4)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(served, digits):
    endpoints, cnn, _, _ = served
    images = digits[1]["val"][0][:48]

    def one(i: int) -> np.ndarray:
        return ask(http, endpoints.http, "digits", "x", np.ascontiguousarray(images[i:i + 1]))

    before = _batches(endpoints.statistics("digits"))
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(len(images))))
    np.testing.assert_allclose(np.concatenate(answers), eager(cnn, images), atol=1e-4)
    ran = _batches_since(endpoints, "digits", before, len(images))
    assert sum(size * count for size, count in ran.items()) == len(images), ran
    assert any(size > 1 and count for size, count in ran.items()), ran  # the dynamic batcher joined requests


def _batches_since(endpoints, model: str, before: dict[int, int], requests: int, wait: float = 10.0) -> dict[int, int]:
    """Executions by batch size since ``before``. The backend reports a batch's statistics after its answers
    went out, so a client can have every answer before the counts show them: read until they add up to
    ``requests`` or ``wait`` seconds pass."""
    import time

    deadline = time.monotonic() + wait
    while True:
        after = _batches(endpoints.statistics(model))
        ran = {size: after.get(size, 0) - before.get(size, 0) for size in after}
        if sum(size * count for size, count in ran.items()) >= requests or time.monotonic() > deadline:
            return ran
        time.sleep(0.1)


def _batches(stats: dict) -> dict[int, int]:
    """Executions by batch size, from the server's own statistics."""
    model = stats["model_stats"][0]
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in model.get("batch_stats", [])}


@pytest.mark.parametrize(("x", "datatype", "needle"), [
    (np.zeros((1, 1, 8, 4), np.float32), "FP32", "unexpected shape for input 'x'"),
    (np.zeros((1, 1, 8, 8), np.int32), "INT32", "data-type is 'INT32'"),
    (np.zeros((65, 1, 8, 8), np.float32), "FP32", "batch-size must be <= 64"),
])
def test_a_bad_request_is_a_400_naming_it_and_the_model_stays_up(served, digits, x, datatype, needle):
    endpoints, cnn, _, _ = served
    client = http.InferenceServerClient(endpoints.http)
    request = http.InferInput("x", list(x.shape), datatype)
    request.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("digits", [request])
    assert caught.value.status() == "400" and needle in caught.value.message(), caught.value
    good = np.ascontiguousarray(digits[1]["val"][0][:2])
    np.testing.assert_allclose(ask(http, endpoints.http, "digits", "x", good), eager(cnn, good), atol=1e-4)


def test_the_warm_up_the_config_asks_for_ran_before_the_server_was_ready(served):
    """Every warm-up sample of each config ran as often as it says, before the server answered ready."""
    import re

    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    endpoints, _, _, _ = served
    log = endpoints.log.read_text(errors="replace")
    for name in ("digits", "encoder"):
        config = text_format.Parse((endpoints.repository / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        assert config.model_warmup, f"{name}'s config asks for no warm-up"
        for sample in config.model_warmup:
            runs = re.findall(rf"model '{name}' instance \S+ is running warmup sample '{sample.name}' for iteration", log)
            assert len(runs) == sample.count, (name, sample.name, len(runs))


def test_the_model_refuses_numpy_2_which_the_backend_would_serve_zeros_under():
    source = Path(__file__).resolve().parents[2] / "exporters" / "servers" / "programs" / "triton_python_model.py"
    loaded = importlib.util.spec_from_file_location("triton_program", source)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    with pytest.raises(RuntimeError, match="NumPy 2.2.6 in the Python environment Triton runs this model in"):
        module.check_numpy("2.2.6", allowed=False)
    module.check_numpy("1.26.4", allowed=False)
    module.check_numpy("2.2.6", allowed=True)


def test_infopt_serve_starts_triton_prints_a_request_that_works_and_stops_on_ctrl_c(served):
    """``infopt serve dist/digits`` as README.md and docs/guide/servers.md show it: an AOTInductor build goes to the bundled Triton."""
    from tests.support.served import serve_and_ask

    _, cnn, _, root = served
    reply, printed, code = serve_and_ask(root / "digits")
    assert code == 0, printed[-3000:]
    assert "with Triton Inference Server on http://127.0.0.1:" in printed and "stopped" in printed
    (output,) = reply["outputs"]
    assert output["name"] == "output" and output["shape"] == [1, 10]
    np.testing.assert_allclose(np.asarray(output["data"], np.float32).reshape(1, 10),
                               eager(cnn, np.zeros((1, 1, 8, 8), np.float32)), atol=1e-4)


def test_a_bounded_load_gets_every_answer_right(served, digits):
    """8 clients for 2 s on the digits model, batches of 1, 2 and 4: no failed and no wrong answer."""
    from tests.support.served import bounded_load

    endpoints, cnn, _, _ = served
    load = bounded_load(f"http://{endpoints.http}/v2/models/digits/infer", cnn, digits[1]["val"][0], seconds=2.0)
    assert load.failed == 0 and load.wrong == 0, load.errors
    assert load.requests >= 8, load
