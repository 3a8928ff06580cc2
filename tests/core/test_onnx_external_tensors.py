"""``core/onnx_graph.save_ir_beside``: a model's tensors written beside its graph at page offsets, by a thread per
core, a lookup table (an embedding a ``Gather`` reads) in small pieces; the model given back as it was, and
ONNX Runtime computing from the file what the model computes."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import infopt.core.onnx_graph as onnx_graph

ir = pytest.importorskip("onnx_ir")


def embedding_then_matmul():
    """``y = embedding[ids] @ weight``: a 1000x256 float table a Gather reads, and a 256x300 weight computed when
    written (a ``LazyTensor``, as a stamped decoder's transposed weights are)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((1000, 256)).astype(np.float32)
    weight = rng.standard_normal((256, 300)).astype(np.float32)
    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["n"]))
    table_v = ir.Value(name="table", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1000, 256]),
                       const_value=ir.tensor(table))
    weight_v = ir.Value(name="weight", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([256, 300]),
                        const_value=ir.LazyTensor(lambda: ir.tensor(weight), dtype=ir.DataType.FLOAT,
                                                  shape=ir.Shape([256, 300])))
    gather = ir.Node("", "Gather", [table_v, ids], name="lookup")
    matmul = ir.Node("", "MatMul", [gather.outputs[0], weight_v], name="project")
    matmul.outputs[0].name, matmul.outputs[0].type = "y", ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([ids], [matmul.outputs[0]], nodes=[gather, matmul], initializers=[table_v, weight_v],
                     opset_imports={"": 17})
    return ir.Model(graph, ir_version=9), table, weight


def test_tensors_are_written_beside_the_graph_at_page_offsets_and_the_model_is_given_back(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_graph, "PIECE_BYTES", 4096)
    model, table, weight = embedding_then_matmul()
    before = {name: value.const_value for name, value in model.graph.initializers.items()}
    path = onnx_graph.save_ir_beside(model, tmp_path / "model.onnx")
    # the model is as it was: its own tensors, not the writer's wrappers
    assert {name: value.const_value for name, value in model.graph.initializers.items()} == before
    saved = onnx.load(str(path), load_external_data=False).graph
    where = {t.name: {e.key: e.value for e in t.external_data} for t in saved.initializer}
    assert {w["location"] for w in where.values()} == {"model.onnx.data"}
    assert all(int(w.get("offset", 0)) % onnx_graph.TENSOR_ALIGN == 0 for w in where.values())
    ids = np.asarray([3, 999, 0, 3], np.int64)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got, table[ids] @ weight, rtol=1e-4, atol=1e-3)


def test_a_lookup_table_is_written_in_pieces_and_other_tensors_whole(monkeypatch):
    monkeypatch.setattr(onnx_graph, "PIECE_BYTES", 4096)
    model, table, _ = embedding_then_matmul()
    assert [v.name for v in onnx_graph._lookup_tables(model.graph)] == ["table"]
    writes = []

    class Recorded(io.BytesIO):
        def write(self, data):
            writes.append(len(data))
            return super().write(data)

    out = Recorded()
    onnx_graph._InPieces(model.graph.initializers["table"].const_value).tofile(out)
    assert out.getvalue() == table.tobytes() and max(writes) == 4096 and len(writes) == table.nbytes // 4096
