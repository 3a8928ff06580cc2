"""Attention masks filled with -40: found in real exported BERTs (both of transformers' attention
implementations), the outputs unchanged on padded batches (every position, a row with no real token
included), and left alone where the constant is not a mask fill or the mask is used for more than a
Softmax."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from infopt.core.artifact import Artifact
from infopt.core.inputspec import InputSpec
from infopt.core.pass_api import PassContext, get_pass
from infopt.core.target import get_target
from infopt.passes.onnx.attention_mask_fill import FILL, fill, masks
from infopt.runtime.backends.onnxruntime import OrtRunner
from tests.support.passes import TinyBert, capture, padded_batch, saved_and_checked

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def bert_onnx(request, tmp_path_factory):
    spec = ["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"]
    artifact = capture(TinyBert(request.param), spec, ["batch=1:4:8", "seq=1:16:32"])
    path = tmp_path_factory.mktemp(request.param) / "bert.onnx"
    saved_and_checked(artifact.obj, InputSpec.parse(spec, ["batch=1:4:8", "seq=1:16:32"]), path)
    return path


def test_a_bert_mask_is_filled_and_the_outputs_stay_the_same(bert_onnx, tmp_path):
    model = onnx.load(str(bert_onnx))
    before = masks(model)
    assert len(before) == 1 and before[0][2] == 2  # one mask, added before both layers' Softmax
    replaced, softmax = fill(model)
    assert replaced == [float(np.finfo(np.float32).min)] and softmax == 2
    assert masks(model) == []  # nothing left to fill: the pass is idempotent
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "filled.onnx"))
    feed = padded_batch()
    (want,), (got,) = OrtRunner(bert_onnx).run(feed), OrtRunner(tmp_path / "filled.onnx").run(feed)
    np.testing.assert_allclose(got[:3], want[:3], rtol=1e-5, atol=1e-5)  # every position, padded ones included
    mask = feed["attention_mask"][..., None]
    pooled = lambda hidden: (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1)  # noqa: E731 (a sentence embedding)
    np.testing.assert_allclose(pooled(got), pooled(want), rtol=1e-5, atol=1e-5)  # the empty row's too (zero)
    assert np.isfinite(got[3]).all()  # the empty row's positions weigh the padding by score now (module text)


def test_the_pass_runs_for_cpu_targets_only(bert_onnx, tmp_path):
    definition = get_pass("attention_mask_fill")
    artifact = Artifact("onnx", InputSpec.parse(["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"]),
                        path=bert_onnx)
    outcome = definition.run(artifact, definition.parse_options({}), PassContext(get_target("cpu"), tmp_path))
    assert outcome.changed and outcome.details.masks == 1 and outcome.details.softmax == 2
    assert "filled with -40 instead of -3.4e+38" in outcome.notes[0]
    filled = onnx.load(str(outcome.artifact.path))
    assert any(i.name.endswith("_mask_fill") and numpy_helper.to_array(i) == FILL for i in filled.graph.initializer)
    gpu = definition.run(artifact, definition.parse_options({}), PassContext(get_target("h100"), tmp_path))
    assert not gpu.changed and gpu.artifact.path == bert_onnx and "not a CPU" in gpu.notes[0]


def masked_softmax(path, *, fill_value=-10000.0, axis=-1, mask_also_output=False, shared_constant=False, op="Mul"):
    """scores[b, h, s, s] + (1 - mask[b, s]) * fill (``op`` Mul) or where(mask, 0, fill) (``op`` Where),
    broadcast through Unsqueeze, then Softmax."""
    nodes = [helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT)]
    inits = [numpy_helper.from_array(np.array(fill_value, np.float32), "fill"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes")]
    if op == "Mul":
        nodes += [helper.make_node("Sub", ["one", "mask_f"], ["inverted"]),
                  helper.make_node("Mul", ["inverted", "fill"], ["additive"])]
    else:
        nodes += [helper.make_node("Cast", ["mask"], ["mask_b"], to=TensorProto.BOOL),
                  helper.make_node("Where", ["mask_b", "zero", "fill"], ["additive"])]
    nodes += [helper.make_node("Unsqueeze", ["additive", "axes"], ["additive4"]),
              helper.make_node("Add", ["scores", "additive4"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["probs"], axis=axis)]
    outputs = [helper.make_tensor_value_info("probs", TensorProto.FLOAT, None)]
    if mask_also_output:
        outputs.append(helper.make_tensor_value_info("additive", TensorProto.FLOAT, None))
    if shared_constant:
        nodes.append(helper.make_node("Add", ["scores", "fill"], ["shifted"]))
        outputs.append(helper.make_tensor_value_info("shifted", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["b", 2, "s", "s"]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return model


@pytest.mark.parametrize(("op", "fill_value"), [
    ("Mul", -10000.0), ("Mul", float(np.finfo(np.float32).min)),
    ("Where", -10000.0), ("Where", float(np.finfo(np.float32).min)), ("Where", -np.inf),
])  # (1 - mask) * -inf is NaN on real keys: no model masks that way
def test_mul_and_where_masks_with_any_large_negative_fill(tmp_path, op, fill_value):
    model = masked_softmax(tmp_path / "m.onnx", fill_value=fill_value, op=op)
    assert fill(model)[0] == [fill_value]
    onnx.save(model, str(tmp_path / "filled.onnx"))
    rng = np.random.default_rng(0)
    feed = {"scores": (rng.standard_normal((3, 2, 6, 6)) * 4).astype(np.float32),
            "mask": np.array([[1] * 6, [1, 1, 0, 0, 0, 0], [0] * 6], np.int64)}
    (want,), (got,) = OrtRunner(tmp_path / "m.onnx").run(feed), OrtRunner(tmp_path / "filled.onnx").run(feed)
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-6, atol=1e-12)
    assert np.all(got[1, :, :, 2:] < 1e-15)  # masked keys still get no weight
    # a row with no real key now weighs its keys by their scores (float32's lowest made it uniform, -inf NaN)
    scores = feed["scores"][2]
    np.testing.assert_allclose(got[2], np.exp(scores) / np.exp(scores).sum(-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize(("why", "kwargs"), [
    ("a small constant is not a mask fill", {"fill_value": -5.0}),
    ("Softmax over another axis", {"axis": 2}),
    ("the mask is also an output", {"mask_also_output": True}),
])
def test_left_alone(tmp_path, why, kwargs):
    model = masked_softmax(tmp_path / "m.onnx", **kwargs)
    assert fill(model) == ([], 0), why


def test_a_constant_shared_with_other_nodes_keeps_its_value_for_them(tmp_path):
    model = masked_softmax(tmp_path / "m.onnx", shared_constant=True)
    assert fill(model)[0] == [-10000.0]
    shifted = next(n for n in model.graph.node if n.output[0] == "shifted")
    assert shifted.input[1] == "fill"
    assert numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "fill")) == -10000.0
