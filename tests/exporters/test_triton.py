"""The Triton config is parsed with Triton's own schema (tritonclient's model_config_pb2)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from infopt.exporters.servers.triton import config_pbtxt
from infopt.inputspec import InputSpec

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
