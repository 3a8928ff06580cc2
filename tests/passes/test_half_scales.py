"""half_scales: a quantized decoder's block scales in float16, run by ONNX Runtime as it runs the float32 ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infopt.core.artifact import Artifact
from infopt.core.inputspec import InputSpec
from tests.support.passes import run_pass

VOCAB, WIDTH = 96, 64


def quantized_decoder(path):
    """ids -> a tied table's 8-bit lookup (GatherBlockQuantized) -> a 4-bit MatMulNBits with a bias -> the tied head
    in 8 bits reading the same table and scales: the shapes half_scales meets in an INT4 or INT8 build."""
    import onnx_ir as ir

    from infopt.passes.decoder.quantize_int4_head import share_table
    from infopt.passes.lower.onnx_int4 import replace_with_nbits
    from infopt.quantize.int4_format import dequantize_int4
    from infopt.quantize.int8_weights import dequantize_8bit, quantize_8bit
    from infopt.quantize.rtn import rtn_quantize

    g = torch.Generator().manual_seed(0)
    table = torch.randn(VOCAB, WIDTH, generator=g)
    body = torch.randn(WIDTH, WIDTH, generator=g) * 0.2
    bias = torch.randn(WIDTH, generator=g).numpy()

    def value(name, array):
        return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(array.shape),
                        const_value=ir.tensor(np.ascontiguousarray(array)))

    ids = ir.Value(name="ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["batch"]))
    table_value, body_value = value("table", table.numpy()), value("body", body.T.numpy())
    head_value = value("head", table.T.numpy())
    lookup = ir.node("Gather", [table_value, ids], {"axis": 0}, name="lookup")
    lookup.outputs[0].dtype, lookup.outputs[0].shape = ir.DataType.FLOAT, ir.Shape(["batch", WIDTH])
    hidden = ir.node("MatMul", [lookup.outputs[0], body_value], name="body")
    hidden.outputs[0].dtype, hidden.outputs[0].shape = ir.DataType.FLOAT, ir.Shape(["batch", WIDTH])
    head = ir.node("MatMul", [hidden.outputs[0], head_value], name="head")
    head.outputs[0].name, head.outputs[0].dtype = "logits", ir.DataType.FLOAT
    head.outputs[0].shape = ir.Shape(["batch", VOCAB])
    graph = ir.Graph([ids], head.outputs, nodes=[lookup, hidden, head],
                     initializers=[table_value, body_value, head_value], opset_imports={"": 17, "com.microsoft": 1})
    packed = rtn_quantize(body, 32, symmetric=False)
    replace_with_nbits(graph, hidden, lookup.outputs[0], packed.qweight.numpy(), packed.scales.numpy(),
                       packed.zeros.numpy(), bias, 32, 4, "body")
    codes, scales, zeros = quantize_8bit(table, 32)
    nbits = replace_with_nbits(graph, head, head.inputs[0], codes.numpy(), scales.numpy(), zeros.numpy(), None, 32, 4,
                               "head", bits=8)
    assert share_table(graph, table_value, nbits, 32, bits=8) == 1
    for name in ("table", "body", "head"):
        graph.initializers.pop(name)
    ir.save(ir.Model(graph, ir_version=10), str(path))
    rows = dequantize_8bit(codes, scales, zeros)
    hidden_weight = dequantize_int4(packed.qweight, packed.scales, packed.zeros, None, 32)
    rows, hidden_weight = rows.double(), hidden_weight.double()
    return path, lambda ids: (rows[ids] @ hidden_weight.T + torch.from_numpy(bias).double()) @ rows.T


def run(path, ids):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]


def test_the_scales_go_to_float16_once_and_the_outputs_stay(tmp_path):
    import onnx

    source, exact = quantized_decoder(tmp_path / "decoder.onnx")
    ids = np.arange(VOCAB, dtype=np.int64)
    before = run(source, ids)
    outcome = run_pass("half_scales", Artifact("onnx", InputSpec([]), path=source), tmp_path / "work")
    assert outcome.changed and outcome.details.nodes == 3  # the lookup, the body, the head
    after_path = outcome.artifact.path
    model = onnx.load(str(after_path))
    scales = {i.name: i.data_type for i in model.graph.initializer if "nbits_scales" in i.name}
    # the head's scales are stored once, in float16, and the lookup reads them through its Reshape
    assert sorted(scales.values()) == [onnx.TensorProto.FLOAT16] * 2
    # every scale of the two tables in two bytes instead of four
    assert outcome.details.saved_bytes == 2 * (VOCAB * WIDTH // 32 + WIDTH * WIDTH // 32)
    after = run(after_path, ids)
    assert after.dtype == np.float32 and np.isfinite(after).all()
    # against the codes' own product in float64: a float16 scale moves a weight by 2^-12 of its step at most, and the
    # outputs are rounded to float16 (2^-11), far below the op's own rounding of its inputs to int8 per block
    want = exact(torch.from_numpy(ids)).double().numpy()
    error_before, error_after = np.sqrt(np.mean((before - want) ** 2)), np.sqrt(np.mean((after - want) ** 2))
    assert error_after <= 1.1 * error_before
    assert (after.argmax(-1) == want.argmax(-1)).mean() >= 0.98


def test_float32_scales_leave_the_graph_as_it_is(tmp_path):
    source, _ = quantized_decoder(tmp_path / "decoder.onnx")
    outcome = run_pass("half_scales", Artifact("onnx", InputSpec([]), path=source), tmp_path / "work", float32=True)
    assert not outcome.changed and outcome.artifact.path == source
    assert "--float32-scales" in outcome.notes[0]


@pytest.mark.parametrize("kind", ["float16 scales already", "no quantized op"])
def test_a_graph_without_float32_block_scales_is_left_as_it_is(tmp_path, kind):
    import onnx_ir as ir

    source, _ = quantized_decoder(tmp_path / "decoder.onnx")
    if kind == "float16 scales already":
        source = run_pass("half_scales", Artifact("onnx", InputSpec([]), path=source), tmp_path / "first").artifact.path
    else:
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
        node = ir.node("Relu", [x], name="relu")
        node.outputs[0].name, node.outputs[0].dtype, node.outputs[0].shape = "y", ir.DataType.FLOAT, ir.Shape([2])
        ir.save(ir.Model(ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 17}), ir_version=10),
                str(source))
    outcome = run_pass("half_scales", Artifact("onnx", InputSpec([]), path=source), tmp_path / "work")
    assert not outcome.changed and "no float32 block scales" in outcome.notes[0]
