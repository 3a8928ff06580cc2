"""Weight-only INT8: each block's 8-bit grid, and ONNX Runtime's MatMulNBits (bits=8) computing with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infopt.quantize.int8_weights import SYMMETRIC_ZERO, dequantize_8bit, quantize_8bit


@pytest.mark.parametrize("symmetric", [False, True])
def test_every_weight_is_within_half_a_step_of_its_min_max_grid(symmetric):
    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(0))
    weight[3, 7] = 40.0  # an outlier coarsens its own block only
    codes, scales, zeros = quantize_8bit(weight, 32, symmetric, search=False)
    assert codes.dtype == zeros.dtype == torch.uint8 and codes.shape == (48, 256) and scales.shape == (48, 8)
    assert torch.equal(scales.half().float(), scales)  # float16 values, as the folder stores them
    step = scales.repeat_interleave(32, 1)
    assert float(((dequantize_8bit(codes, scales, zeros) - weight).abs() / step).max()) <= 0.5 + 1e-3
    assert float(scales[3, 0]) > 5 * float(scales[3, 1:].max())
    if symmetric:
        assert bool((zeros == SYMMETRIC_ZERO).all())


def test_the_searched_symmetric_grid_rounds_with_less_error_than_max_over_127():
    weight = torch.randn(48, 256, generator=torch.Generator().manual_seed(0))
    weight[3, 7] = 40.0

    def error(search):
        codes, scales, zeros = quantize_8bit(weight, 32, symmetric=True, search=search)
        assert bool((zeros == SYMMETRIC_ZERO).all()) and torch.equal(scales.half().float(), scales)
        return float(((dequantize_8bit(codes, scales, zeros) - weight) ** 2).sum())

    assert error(True) <= 0.97 * error(False)


def test_a_bf16_weight_rounds_as_its_float32_widening():
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for got, want in zip(quantize_8bit(weight, 32), quantize_8bit(weight.float(), 32)):
        assert torch.equal(got, want)


@pytest.mark.parametrize(("accuracy_level", "tolerance"), [(0, 1e-4), (4, 2e-2)])
def test_onnx_runtime_matmulnbits_computes_with_the_8bit_weight(accuracy_level, tolerance):
    """The real consumer: an ONNX Runtime session of one MatMul rewritten by ``replace_with_nbits(bits=8)``."""
    import onnx_ir as ir
    import onnxruntime as ort

    from infopt.passes.lower.onnx_int4 import replace_with_nbits

    k, n = 128, 96
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(2))
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", k]))
    w = ir.Value(name="w", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([k, n]),
                 const_value=ir.tensor(weight.T.contiguous().numpy()))
    node = ir.node("MatMul", [x, w], name="matmul")
    node.outputs[0].name, node.outputs[0].dtype, node.outputs[0].shape = "y", ir.DataType.FLOAT, ir.Shape(["batch", n])
    graph = ir.Graph([x], node.outputs, nodes=[node], initializers=[w], opset_imports={"": 17})
    codes, scales, zeros = quantize_8bit(weight, 32)
    replace_with_nbits(graph, node, x, codes.numpy(), scales.numpy(), zeros.numpy(), None, 32, accuracy_level, "w",
                       bits=8)
    graph.initializers.pop("w")
    model = ir.Model(graph, ir_version=10)
    model.opset_imports["com.microsoft"] = 1
    [nbits] = [nd for nd in graph if nd.op_type == "MatMulNBits"]
    assert nbits.attributes["bits"].as_int() == 8 and list(nbits.inputs[1].shape) == [n, k // 32, 32]
    session = ort.InferenceSession(ir.serde.serialize_model(model).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    inputs = np.random.default_rng(3).standard_normal((4, k)).astype(np.float32)
    got = session.run(None, {"x": inputs})[0]
    want = inputs @ dequantize_8bit(codes, scales, zeros).numpy().T
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()
    assert np.abs(got - inputs @ weight.numpy().T).max() <= 0.02 * np.abs(want).max()
