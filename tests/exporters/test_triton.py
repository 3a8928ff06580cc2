"""The Triton config is parsed with Triton's own schema (tritonclient's model_config_pb2)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from google.protobuf import text_format

from infopt.core.errors import UsageError
from infopt.core.inputspec import InputSpec
from infopt.exporters.servers.triton import config_pbtxt, write_repository

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def parse(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_dynamic_batch_config():
    spec = InputSpec.parse(["input_ids:int64[batch,seq]", "mask:int64[batch,seq]"], ["batch=1:8:32", "seq=2:16:128"])
    cfg = parse(config_pbtxt("enc", spec, [("logits", "float32", ("batch", 2))], "cpu"))
    assert cfg.name == "enc" and cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == 32
    assert [i.name for i in cfg.input] == ["input_ids", "mask"]
    assert list(cfg.input[0].dims) == [-1]
    assert cfg.input[0].data_type == model_config_pb2.TYPE_INT64
    assert list(cfg.output[0].dims) == [2] and cfg.output[0].data_type == model_config_pb2.TYPE_FP32
    assert cfg.HasField("dynamic_batching")
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8, 32]
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_static_shapes_have_no_batching():
    spec = InputSpec.parse(["x:float32[4,3]"])
    cfg = parse(config_pbtxt("static", spec, [("y", "float16", (4, 2))], "cuda"))
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [4, 3]
    assert not cfg.HasField("dynamic_batching")
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def test_output_without_batch_dim_disables_batching():
    spec = InputSpec.parse(["x:float32[batch,3]"])
    cfg = parse(config_pbtxt("m", spec, [("y", "float32", (3,))], "cpu"))
    assert cfg.max_batch_size == 0
    assert list(cfg.input[0].dims) == [-1, 3]


def test_tensorrt_plan_repository(tmp_path):
    spec = InputSpec.parse(["x:float32[batch,3,16,16]"], ["batch=1:4:8"])
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"serialized engine bytes")
    folder = write_repository(tmp_path / "repo", "cnn", plan, spec, [("y", "float32", ("batch", 4))], "cpu")
    assert (folder / "1" / "model.plan").read_bytes() == b"serialized engine bytes"
    text = (folder / "config.pbtxt").read_text()
    assert "backend:" not in text
    cfg = parse(text)
    assert cfg.platform == "tensorrt_plan" and cfg.backend == ""
    assert cfg.max_batch_size == 8
    assert list(cfg.input[0].dims) == [3, 16, 16] and list(cfg.output[0].dims) == [4]
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU  # an engine runs on a GPU


def test_onnx_with_server_built_engine(tmp_path):
    spec = InputSpec.parse(["input_ids:int64[batch,seq]", "mask:int64[batch,seq]"], ["batch=1:8:32", "seq=2:16:128"])
    model = tmp_path / "model.onnx"
    model.write_bytes(b"onnx")
    folder = write_repository(tmp_path / "repo", "enc", model, spec, [("logits", "float32", ("batch", 2))], "cuda",
                              server_engine={"precision_mode": "FP16", "workspace_bytes": 2 * 2**30})
    assert (folder / "1" / "model.onnx").read_bytes() == b"onnx"
    cfg = parse((folder / "config.pbtxt").read_text())
    assert cfg.backend == "onnxruntime" and cfg.platform == ""
    (accelerator,) = cfg.optimization.execution_accelerators.gpu_execution_accelerator
    assert not cfg.optimization.execution_accelerators.cpu_execution_accelerator
    assert accelerator.name == "tensorrt"
    params = dict(accelerator.parameters)
    assert params["precision_mode"] == "FP16"
    assert params["max_workspace_size_bytes"] == str(2 * 2**30)
    assert params["trt_engine_cache_enable"] == "1" and params["trt_engine_cache_path"].endswith("/enc")
    assert params["trt_profile_min_shapes"] == "input_ids:1x2,mask:1x2"
    assert params["trt_profile_opt_shapes"] == "input_ids:8x16,mask:8x16"
    assert params["trt_profile_max_shapes"] == "input_ids:32x128,mask:32x128"
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


def test_server_engine_on_static_shapes_has_no_profile(tmp_path):
    spec = InputSpec.parse(["x:float32[2,3]"])
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx")
    folder = write_repository(tmp_path / "repo", "m", model, spec, [("y", "float32", (2, 3))], "cuda",
                              server_engine={"precision_mode": "INT8", "workspace_bytes": 1 << 30, "cache_path": "/engines"})
    (accelerator,) = parse((folder / "config.pbtxt").read_text()).optimization.execution_accelerators.gpu_execution_accelerator
    params = dict(accelerator.parameters)
    assert params["precision_mode"] == "INT8" and params["trt_engine_cache_path"] == "/engines"
    assert not any(k.startswith("trt_profile_") for k in params)


def test_onnx_repository_is_unchanged_without_server_engine(tmp_path):
    spec = InputSpec.parse(["x:float32[batch,3]"])
    model = tmp_path / "exported.onnx"
    model.write_bytes(b"onnx")
    (tmp_path / "exported.onnx.data").write_bytes(b"weights")
    folder = write_repository(tmp_path / "repo", "m", model, spec, [("y", "float32", ("batch", 3))], "cpu")
    assert (folder / "1" / "model.onnx").exists() and (folder / "1" / "exported.onnx.data").read_bytes() == b"weights"
    cfg = parse((folder / "config.pbtxt").read_text())
    assert cfg.backend == "onnxruntime" and not cfg.HasField("optimization")
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU


def test_unknown_suffix_and_misplaced_server_engine_are_usage_errors(tmp_path):
    spec = InputSpec.parse(["x:float32[2]"])
    for name, engine in (("model.pt", None), ("model.plan", {"precision_mode": "FP16", "workspace_bytes": 1})):
        model = tmp_path / name
        model.write_bytes(b"x")
        with pytest.raises(UsageError):
            write_repository(tmp_path / "repo", "m", model, spec, [("y", "float32", (2,))], "cuda", server_engine=engine)


def test_python_backend_config_for_pt2(tmp_path):
    spec = InputSpec.parse(["x:float32[batch,6]"], ["batch=1:4:16"])
    package = tmp_path / "model.pt2"
    package.write_bytes(b"pt2")
    folder = write_repository(tmp_path / "repo", "lin", package, spec, [("y", "float32", ("batch", 3))], "cuda")
    assert (folder / "1" / "model.pt2").read_bytes() == b"pt2"
    source = (folder / "1" / "model.py").read_text()
    compile(source, "model.py", "exec")
    assert "import triton_python_backend_utils as pb_utils" in source and "class TritonPythonModel" in source
    cfg = parse((folder / "config.pbtxt").read_text())
    assert cfg.backend == "python" and cfg.platform == ""
    assert cfg.max_batch_size == 16 and list(cfg.input[0].dims) == [6] and list(cfg.output[0].dims) == [3]
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU


@pytest.mark.slow
def test_python_backend_model_runs_a_real_pt2(tmp_path, monkeypatch):
    """model.py's inference logic on its own; a real Triton serves it in test_triton_server.py."""
    torch = pytest.importorskip("torch")
    from torch.export import Dim

    from infopt.core.cache import cache_dir

    # infopt's own Inductor cache, as builds use it: a fresh one recompiles the AOTI headers (about 9 s)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir("inductor")))
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3).eval()
    example = (torch.randn(4, 6),)
    program = torch.export.export(model, example, dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    package = tmp_path / "lin.pt2"
    torch._inductor.aoti_compile_and_package(program, package_path=str(package))
    spec = InputSpec.parse(["x:float32[batch,6]"], ["batch=1:4:16"])
    folder = write_repository(tmp_path / "repo", "lin", package, spec, [("y", "float32", ("batch", 3))], "cpu")

    loaded = importlib.util.spec_from_file_location("triton_lin_model", folder / "1" / "model.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)  # imports without Triton's pb_utils
    compiled = module.load_package(folder / "1" / "model.pt2", "cpu")
    for n in (1, 5):
        x = np.random.default_rng(n).standard_normal((n, 6), dtype=np.float32)
        (got,) = module.infer(compiled, [x])
        with torch.no_grad():
            want = model(torch.from_numpy(x)).numpy()
        assert got.shape == (n, 3)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
