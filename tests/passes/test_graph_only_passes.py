"""Passes that change only the graph of a model whose tensors lie beside it (``model.onnx.data``, as every model
past ``EXTERNAL_DATA_BYTES`` is written) read and write the graph alone: the tensors' file is copied beside the
new graph under its name, never loaded, and the result computes what the source did."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from infopt.core import onnx_graph
from infopt.core.artifact import Artifact
from infopt.core.inputspec import InputSpec
from infopt.runtime.backends.onnxruntime import OrtRunner
from tests.support.passes import TinyBert, capture, padded_batch, run_pass, saved_and_checked

pytest.importorskip("transformers")

SPEC = ["input_ids:int64[batch,seq]", "attention_mask:int64[batch,seq]"]
DIMS = ["batch=1:4:8", "seq=1:16:32"]


@pytest.fixture(scope="module")
def beside(tmp_path_factory):
    """A tiny BERT exported to ONNX, then saved with its tensors in ``bert.onnx.data`` beside the graph."""
    folder = tmp_path_factory.mktemp("beside")
    model = saved_and_checked(capture(TinyBert("eager"), SPEC, DIMS).obj, InputSpec.parse(SPEC, DIMS), folder / "inline.onnx")
    onnx.save(model, str(folder / "bert.onnx"), save_as_external_data=True, location="bert.onnx.data")
    return folder / "bert.onnx"


def artifact(path) -> Artifact:
    return Artifact("onnx", InputSpec.parse(SPEC, DIMS), path=path)


def test_a_graph_saved_elsewhere_takes_its_tensors_file_along_under_its_own_name(beside, tmp_path):
    graph = onnx_graph.load_graph(beside)
    outside = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(outside) > 10 and not any(t.raw_data for t in outside)  # the tensors beside it were not read
    graph.graph.node[0].name = "renamed_first_node"
    dst = onnx_graph.save_graph(graph, beside, tmp_path / "out" / "model.onnx")
    assert onnx_graph.external_files(dst) == {"model.onnx.data"}
    assert (tmp_path / "out" / "model.onnx.data").read_bytes() == beside.with_name("bert.onnx.data").read_bytes()
    assert onnx_graph.external_files(beside) == {"bert.onnx.data"}  # the source is untouched
    feed = padded_batch()
    np.testing.assert_array_equal(OrtRunner(dst).run(feed)[0], OrtRunner(beside).run(feed)[0])
    placed = onnx_graph.place_model(dst, tmp_path / "shipped" / "renamed.onnx")
    assert onnx_graph.external_files(placed) == {"renamed.onnx.data"}
    np.testing.assert_array_equal(OrtRunner(placed).run(feed)[0], OrtRunner(beside).run(feed)[0])


def test_the_mask_fill_rewrites_the_graph_and_copies_the_tensors(beside, tmp_path):
    outcome = run_pass("attention_mask_fill", artifact(beside), tmp_path)
    assert outcome.changed and outcome.details.masks == 1
    path = outcome.artifact.path
    assert onnx_graph.external_files(path) == {path.name + ".data"}
    assert path.with_name(path.name + ".data").read_bytes() == beside.with_name("bert.onnx.data").read_bytes()
    feed = padded_batch()
    want, got = OrtRunner(beside).run(feed)[0], OrtRunner(path).run(feed)[0]
    np.testing.assert_allclose(got[:3], want[:3], rtol=1e-5, atol=1e-5)  # the rows with a real token


def test_onnx_runtimes_optimization_and_the_unfusing_keep_the_tensors_beside(beside, tmp_path):
    outcome = run_pass("ort_optimize", artifact(beside), tmp_path, skip_layernorm="unfuse")
    path = outcome.artifact.path
    assert any("SkipLayerNormalization unfused into Sum + LayerNormalization" in n for n in outcome.notes)
    ops = {n.op_type for n in onnx_graph.load_graph(path).graph.node}
    assert "SkipLayerNormalization" not in ops and {"Sum", "LayerNormalization"} <= ops
    assert onnx_graph.external_files(path) == {path.name + ".data"}
    feed = padded_batch()
    np.testing.assert_allclose(OrtRunner(path).run(feed)[0], OrtRunner(beside).run(feed)[0], rtol=1e-4, atol=1e-4)
