"""``core/tensor_file.py``: a model rewritten with its large tensors streamed from its tensors' file to a new one,
taken by ONNX Runtime as the same model, and nothing half-written left behind by a failure."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import infopt.core.tensor_file as tensor_file
from infopt.core.onnx_graph import drop_initializers, load_graph
from infopt.core.tensor_file import TensorFile


def two_matmuls(folder):
    """``y = x @ a + x @ b`` with 256x512 float weights kept in ``model.onnx.data``; the weights returned too."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 512)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "a"], ["xa"]), helper.make_node("MatMul", ["x", "b"], ["xb"]),
         helper.make_node("Add", ["xa", "xb"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 512])],
        [numpy_helper.from_array(a, "a"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "src" / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path, a, b


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_a_rewritten_model_reads_its_tensors_from_the_new_file(tmp_path, monkeypatch, kernel_copy):
    monkeypatch.setattr(tensor_file, "INLINE_BYTES", 1024)
    if not kernel_copy:  # a file system without copy_file_range: the bytes go through memory in chunks
        monkeypatch.setattr(os, "copy_file_range", lambda *a: (_ for _ in ()).throw(OSError(18, "cross-device")))
    source, a, b = two_matmuls(tmp_path)
    before = (source.parent / "model.onnx.data").read_bytes()
    model = load_graph(source)
    dst = tmp_path / "out" / "model.onnx"
    with TensorFile(model, source, dst) as tensors:
        inits = {t.name: t for t in model.graph.initializer}
        mapped = tensors.array(inits["b"])
        assert isinstance(mapped, np.memmap) and np.array_equal(mapped, b)
        tensors.add(model.graph, np.concatenate([a, mapped], axis=1), "ab")  # written into the new file at once
        tensors.add(model.graph, np.asarray([512, 512], np.int64), "small")  # a small one stays in the graph
        assert tensors.data_path.stat().st_size == a.nbytes * 2
        # the graph packed as fuse_matmuls packs it: one MatMul over [a b], split back; b no longer read
        del model.graph.node[:2]
        model.graph.node.insert(0, helper.make_node("MatMul", ["x", "ab"], ["xab"]))
        model.graph.node.insert(1, helper.make_node("Split", ["xab", "small"], ["xa", "xb"], axis=-1))
        drop_initializers(model.graph, {"b"})
        assert [t.name for t in model.graph.initializer] == ["a", "ab", "small"]
        saved = tensors.save()
    graph = onnx.load(str(saved), load_external_data=False).graph
    where = {t.name: {e.key: e.value for e in t.external_data} for t in graph.initializer}
    assert {name: info.get("location") for name, info in where.items()} == {
        "a": "model.onnx.data", "ab": "model.onnx.data", "small": None}
    assert all(int(where[n]["offset"]) % tensor_file.ALIGN == 0 for n in ("a", "ab"))
    loaded = {t.name: numpy_helper.to_array(t, str(saved.parent)) for t in graph.initializer}
    assert np.array_equal(loaded["a"], a) and np.array_equal(loaded["ab"], np.concatenate([a, b], axis=1))
    assert (source.parent / "model.onnx.data").read_bytes() == before  # the source's file is only read
    # its real consumer: ONNX Runtime computes the model from the new file as from the old one
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    got = ort.InferenceSession(str(saved), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ a + x @ b, rtol=1e-4, atol=1e-3)


def test_a_failure_leaves_no_half_written_tensors_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_file, "INLINE_BYTES", 1024)
    source, a, _ = two_matmuls(tmp_path)
    model = load_graph(source)
    dst = tmp_path / "out" / "model.onnx"
    with pytest.raises(RuntimeError, match="packing failed"):
        with TensorFile(model, source, dst) as tensors:
            tensors.add(model.graph, a * 2, "twice")
            raise RuntimeError("packing failed")
    assert not dst.exists() and not dst.with_name("model.onnx.data").exists()


def test_a_rewrite_that_adds_no_tensor_takes_the_work_file_over_and_gives_it_back(tmp_path, monkeypatch):
    """``take_over``: a graph-only rewrite moves the source's tensors' file rather than copying it, offsets kept; a
    rewrite not kept (ONNX Runtime refused it) or that failed gives it back; one that adds a tensor, or leaves more
    than :data:`~infopt.core.tensor_file.UNREAD_SHARE` of the file unread, copies as before."""
    monkeypatch.setattr(tensor_file, "INLINE_BYTES", 1024)
    copied = []
    monkeypatch.setattr(tensor_file, "_copy_range", lambda *a: copied.append(a))
    source, a, b = two_matmuls(tmp_path)
    data = source.parent / "model.onnx.data"
    before = data.read_bytes()
    model = load_graph(source)
    dst = tmp_path / "out" / "model.onnx"
    with TensorFile(model, source, dst, take_over=True) as tensors:
        model.graph.node[2].op_type = "Sub"  # the graph changes, no tensor does
        saved = tensors.save()
    assert tensors.taken_from == data and not data.exists() and copied == []
    assert tensors.data_path.read_bytes() == before
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    got = ort.InferenceSession(str(saved), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ a - x @ b, rtol=1e-4, atol=1e-3)
    tensors.give_back()
    assert data.read_bytes() == before and not tensors.data_path.exists()
    # a failure after the file was taken gives it back too
    model = load_graph(source)
    with pytest.raises(RuntimeError, match="after saving"):
        with TensorFile(model, source, dst, take_over=True) as tensors:
            tensors.save()
            raise RuntimeError("after saving")
    assert data.read_bytes() == before and not tensors.data_path.exists()
    # a tensor dropped (half the file unread) or one added: copied, the source's file left where it is
    for rewrite in ("drop", "add"):
        model = load_graph(source)
        with TensorFile(model, source, dst, take_over=True) as tensors:
            if rewrite == "drop":
                model.graph.node[1].input[1] = "a"
                drop_initializers(model.graph, {"b"})
            else:
                tensors.add(model.graph, a * 2, "twice")
            tensors.save()
        assert tensors.taken_from is None and data.read_bytes() == before and copied
