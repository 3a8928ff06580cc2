"""SkipLayerNormalization unfused into Sum + LayerNormalization: the same outputs, not fused back when
ONNX Runtime loads the model, left fused where its mean or inverse-std output is used, and
``ort_optimize`` on a CPU target doing what its timing says."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from infopt.core.inputspec import InputSpec
from infopt.passes.onnx import skip_layernorm
from infopt.passes.onnx.ort_optimize import op_histogram
from infopt.runtime.backends.onnxruntime import OrtRunner
from tests.support.passes import TinyBert, capture, padded_batch, run_pass, saved_and_checked

HIDDEN = 16


def skip_model(path, *, bias=True, sum_output=False, mean_output=False, beta=True):
    """y = SkipLayerNormalization(x, skip, gamma, beta, bias) -> Relu, optionally exposing the sum or the mean."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), n) for n in ("gamma", "beta", "bias")]
    inputs = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    outputs = ["y", "mean" if mean_output else "", "", "total" if sum_output else ""]
    nodes = [helper.make_node("SkipLayerNormalization", inputs, outputs, domain="com.microsoft", epsilon=1e-5, name="sln"),
             helper.make_node("Relu", ["y"], ["out"])]
    shapes = {"out": ["b", "s", HIDDEN], "total": ["b", "s", HIDDEN], "mean": ["b", "s", 1]}
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in shapes.items()
            if n == "out" or n in outputs]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", HIDDEN])
                                           for n in ("x", "skip")], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(path))
    return model


def feed():
    rng = np.random.default_rng(1)
    return {n: (rng.standard_normal((3, 5, HIDDEN)) * 3).astype(np.float32) for n in ("x", "skip")}


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"sum_output": True}, {"beta": False}])
def test_unfused_outputs_match_the_fused_kernel(tmp_path, kwargs):
    model = skip_model(tmp_path / "fused.onnx", **kwargs)
    assert skip_layernorm.unfuse(model) == 1
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops == {"Sum": 1, "LayerNormalization": 1, "Relu": 1}
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "unfused.onnx"))
    want, got = OrtRunner(tmp_path / "fused.onnx").run(feed()), OrtRunner(tmp_path / "unfused.onnx").run(feed())
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_onnx_runtime_does_not_fuse_it_back_when_it_loads_the_model(tmp_path):
    model = skip_model(tmp_path / "fused.onnx")
    skip_layernorm.unfuse(model)
    onnx.save(model, str(tmp_path / "unfused.onnx"))
    options = ort.SessionOptions()  # what a server does: every optimization on at load
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(tmp_path / "unfused.onnx"), options, providers=["CPUExecutionProvider"])
    assert "com.microsoft.SkipLayerNormalization" not in op_histogram(tmp_path / "loaded.onnx")


def test_a_node_whose_mean_output_is_used_stays_fused(tmp_path):
    model = skip_model(tmp_path / "fused.onnx", mean_output=True)
    assert skip_layernorm.fused_nodes(model) == [] and skip_layernorm.unfuse(model) == 0


def test_the_timing_compares_the_two_forms_at_the_hidden_size():
    timing = skip_layernorm.measure(HIDDEN, runs=3)
    assert timing.shape == (8, 128, HIDDEN) and timing.fused_ms > 0 and timing.unfused_ms > 0
    assert f"on [8, 128, {HIDDEN}] here" in str(timing)


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    pytest.importorskip("transformers")
    spec = ["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"]
    artifact = capture(TinyBert("sdpa"), spec, ["batch=1:4:8", "seq=1:16:32"])
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    saved_and_checked(artifact.obj, InputSpec.parse(spec, ["batch=1:4:8", "seq=1:16:32"]), path)
    return artifact.derive("onnx", path=path)


@pytest.mark.parametrize("mode", ["keep", "unfuse", "measure"])
def test_ort_optimize_on_a_bert(bert_onnx, tmp_path, mode):
    outcome = run_pass("ort_optimize", bert_onnx, tmp_path, skip_layernorm=mode)
    ops = op_histogram(outcome.artifact.path)
    unfused = [n for n in outcome.notes if "unfused into Sum + LayerNormalization" in n]
    if mode == "keep":
        assert ops["com.microsoft.SkipLayerNormalization"] >= 2 and not unfused
    elif mode == "unfuse":
        assert ops["com.microsoft.SkipLayerNormalization"] == 0 and ops["Sum"] >= 2 and unfused
    else:  # the note gives both timings, and the graph follows them
        note = next(n for n in outcome.notes if "SkipLayerNormalization" in n and " ms" in n)
        assert ("unfused" in note) == (ops["com.microsoft.SkipLayerNormalization"] == 0)
    (want,), (got,) = OrtRunner(bert_onnx.path).run(padded_batch()), OrtRunner(outcome.artifact.path).run(padded_batch())
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
