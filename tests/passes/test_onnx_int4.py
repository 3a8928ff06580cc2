"""INT4 layers lowered to ONNX Runtime's MatMulNBits: ops after the pass, numbers, checker, layout."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from infopt.core.errors import BuildError
from infopt.quantize.int4_format import (
    Int4Linear,
    Int4Weight,
    grid,
    int4_layers,
    pack_int4,
    quantize_codes,
    replace_module,
    unpack_int4,
)
from infopt.runtime.backends.onnxruntime import OrtRunner
from infopt.validators.metrics import cosine, max_abs
from tests.support.passes import capture, run_pass

SPEC = "x:float32[batch,seq,256]"
DIMS = ("batch=1:4:16", "seq=1:8:32")
SHAPES = ((1, 8), (5, 3), (3, 17))


class Mlp(nn.Module):
    """256 -> 384 -> 128 -> 10; ``fc1`` and ``fc2`` get quantized, ``head`` stays float."""

    def __init__(self, bias: bool):
        super().__init__()
        self.fc1 = nn.Linear(256, 384, bias=bias)
        self.fc2 = nn.Linear(384, 128, bias=bias)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(nn.functional.gelu(self.fc1(x)))))


def act_order_g_idx(in_features: int, group_size: int, generator) -> torch.Tensor:
    """A random permutation of the input features, assigned to groups ``g`` at a time (GPTQ act-order)."""
    perm = torch.randperm(in_features, generator=generator)
    g_idx = torch.empty(in_features, dtype=torch.int32)
    g_idx[perm] = (torch.arange(in_features) // group_size).to(torch.int32)
    return g_idx


def quantized(weight: torch.Tensor, group_size: int, symmetric: bool, g_idx=None, input_scale=None) -> Int4Weight:
    """RTN on the grid of ``int4_format``, groups taken in ``g_idx`` order when given."""
    n, k = weight.shape
    order = torch.arange(k) if g_idx is None else torch.argsort(g_idx.long(), stable=True)
    grouped = (weight * (1 if input_scale is None else input_scale))[:, order].reshape(-1, group_size)
    scale, zero = grid(grouped, symmetric)
    codes = torch.empty(n, k)
    codes[:, order] = quantize_codes(grouped, scale, zero).reshape(n, k)
    return Int4Weight.from_codes(codes, scale.reshape(n, -1), zero.reshape(n, -1), group_size, symmetric,
                                 g_idx=g_idx, input_scale=input_scale)


def int4_mlp(group_size: int, symmetric: bool, bias: bool, act_order: bool = False, awq: bool = False) -> nn.Module:
    generator = torch.Generator().manual_seed(group_size + 2 * symmetric + 4 * bias + 8 * act_order + 16 * awq)
    torch.manual_seed(generator.initial_seed())
    model = Mlp(bias)
    for name in ("fc1", "fc2"):
        linear = model.get_submodule(name)
        k = linear.in_features
        g_idx = act_order_g_idx(k, group_size, generator) if act_order else None
        input_scale = torch.rand(k, generator=generator) + 0.5 if awq else None
        weight = quantized(linear.weight.detach(), group_size, symmetric, g_idx, input_scale)
        assert (weight.g_idx is not None) == act_order
        replace_module(model, name, Int4Linear(weight, linear.bias))
    return model.eval()


def histogram(model: onnx.ModelProto) -> Counter:
    return Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def export_and_optimize(module, tmp_path, **options):
    art = capture(module, SPEC, DIMS)
    exported = run_pass("onnx_export", art, tmp_path, **options)
    optimized = run_pass("ort_optimize", exported.artifact, tmp_path)
    return exported, optimized


def assert_matches(module, path, tolerance=1e-4):
    runner = OrtRunner(path)
    generator = torch.Generator().manual_seed(0)
    for batch, seq in SHAPES:
        x = torch.randn(batch, seq, 256, generator=generator)
        with torch.no_grad():
            reference = module(x).numpy()
        got = runner.run({"x": x.numpy()})[0]
        assert got.shape == (batch, seq, 10)
        assert max_abs(reference, got) <= tolerance * max(1.0, float(np.abs(reference).max()))


def assert_layout(model: onnx.ModelProto, module: nn.Module) -> None:
    """Each MatMulNBits holds its layer's own codes, scales and zero points, not a re-quantization."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producers = {out: n for n in model.graph.node for out in n.output}
    nodes = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            nodes[(attrs["K"], attrs["N"])] = (node, attrs)
    for weight in int4_layers(module).values():
        node, attrs = nodes[(weight.in_features, weight.out_features)]
        g, n, k = weight.group_size, weight.out_features, weight.in_features
        assert node.domain == "com.microsoft" and attrs["bits"] == 4 and attrs["block_size"] == g
        assert all(name in inits for name in node.input[1:] if name)
        order = torch.arange(k) if weight.g_idx is None else torch.argsort(weight.g_idx.long(), stable=True)
        qweight = pack_int4(unpack_int4(weight.qweight)[:, order])
        b = inits[node.input[1]]
        assert b.dtype == np.uint8 and b.shape == (n, k // g, g // 2)
        assert b.tobytes() == qweight.numpy().tobytes()
        np.testing.assert_array_equal(inits[node.input[2]], weight.scales.numpy())
        if weight.symmetric:
            assert len(node.input) < 4 or not node.input[3]
        else:
            packed = inits[node.input[3]]
            assert packed.shape == (n, (k // g + 1) // 2)
            unpacked = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)[:, : k // g]
            np.testing.assert_array_equal(unpacked, weight.zeros.numpy())
        gather = producers.get(node.input[0])
        if weight.g_idx is None:
            assert gather is None or gather.op_type != "Gather"
        else:
            assert gather.op_type == "Gather"
            np.testing.assert_array_equal(inits[gather.input[1]], order.numpy())


CASES = [
    dict(group_size=32, symmetric=True, bias=True),
    dict(group_size=32, symmetric=False, bias=False),
    dict(group_size=128, symmetric=True, bias=False),
    dict(group_size=128, symmetric=False, bias=True),
    dict(group_size=32, symmetric=False, bias=True, act_order=True),
    dict(group_size=128, symmetric=True, bias=False, act_order=True, awq=True),
    dict(group_size=32, symmetric=False, bias=True, awq=True),
]


def case_id(case: dict) -> str:
    flags = [f"g{case['group_size']}", "sym" if case["symmetric"] else "asym", "bias" if case["bias"] else "nobias"]
    return "-".join(flags + [k.replace("_", "") for k in ("act_order", "awq") if case.get(k)])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_int4_layers_become_matmulnbits(case, tmp_path):
    module = int4_mlp(**case)
    exported, optimized = export_and_optimize(module, tmp_path)
    assert exported.details.matmul_nbits == 2 and any("2 INT4 layers as MatMulNBits" in n for n in exported.notes)
    for path in (exported.artifact.path, optimized.artifact.path):
        model = onnx.load(str(path))
        onnx.checker.check_model(model, full_check=True)
        ops = histogram(model)
        assert ops["com.microsoft::MatMulNBits"] == 2
        assert ops["Gather"] == (2 if case.get("act_order") else 0)
        uint8 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.UINT8}
        assert uint8 and all(not set(n.input) & uint8 for n in model.graph.node if n.op_type != "MatMulNBits")
        float_weights = {i for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "FusedMatMul") for i in n.input}
        assert float_weights & {t.name for t in model.graph.initializer if list(t.dims) in ([10, 128], [128, 10])}
        assert not float_weights & {t.name for t in model.graph.initializer if 384 in t.dims or 256 in t.dims}
        assert {"Reshape", "BitShift", "BitwiseAnd", "BitwiseOr", "DequantizeLinear"}.isdisjoint(ops)
        assert_layout(model, module)
        assert_matches(module, path)
    graph_input = onnx.load(str(exported.artifact.path)).graph.input[0]
    assert [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim] == ["batch", "seq", 256]


def test_accuracy_level_and_unoptimized_export(tmp_path):
    module = int4_mlp(group_size=32, symmetric=False, bias=True)
    exported, optimized = export_and_optimize(module, tmp_path, optimize=False, int4_accuracy_level=4)
    model = onnx.load(str(optimized.artifact.path))
    levels = [a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"]
    assert levels == [4, 4]
    runner = OrtRunner(optimized.artifact.path)
    x = torch.randn(3, 11, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = module(x).numpy()
    assert cosine(reference, runner.run({"x": x.numpy()})[0]) > 0.999
    assert_layout(onnx.load(str(exported.artifact.path)), module)


def test_float16_model_gets_float16_scales_and_bias(tmp_path):
    module = int4_mlp(group_size=32, symmetric=False, bias=True, act_order=True).half()
    out = run_pass("onnx_export", capture(module, "x:float16[batch,seq,256]", DIMS), tmp_path)
    model = onnx.load(str(out.artifact.path))
    onnx.checker.check_model(model, full_check=True)
    inits = {t.name: t.data_type for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == 2
    assert all(inits[n.input[2]] == inits[n.input[5]] == onnx.TensorProto.FLOAT16 for n in nodes)
    x = torch.randn(2, 7, 256, generator=torch.Generator().manual_seed(2)).half()
    with torch.no_grad():
        reference = module(x).float().numpy()
    got = OrtRunner(out.artifact.path).run({"x": x.numpy()})[0]
    assert got.dtype == np.float16
    assert max_abs(reference, got) <= 5e-3 * max(1.0, float(np.abs(reference).max()))


def test_plain_model_gets_no_matmulnbits(tmp_path):
    torch.manual_seed(0)
    exported, _ = export_and_optimize(Mlp(bias=True).eval(), tmp_path)
    assert exported.details.matmul_nbits is None
    ops = histogram(onnx.load(str(exported.artifact.path)))
    assert "com.microsoft::MatMulNBits" not in ops and ops["MatMul"] == 3


def one_layer(weight: Int4Weight) -> nn.Module:
    model = Mlp(bias=False)
    replace_module(model, "fc1", Int4Linear(weight, None))
    return model.eval()


def test_group_size_onnx_runtime_cannot_run_is_an_error(tmp_path):
    torch.manual_seed(0)
    module = one_layer(quantized(torch.randn(384, 256), 8, symmetric=True))
    with pytest.raises(BuildError, match="group size of 16, 32, 64, 128, 256") as err:
        run_pass("onnx_export", capture(module, SPEC, DIMS), tmp_path)
    assert "32, 64 or 128" in err.value.fix and "node" in err.value.where


def test_unequal_act_order_groups_are_an_error(tmp_path):
    torch.manual_seed(0)
    g_idx = (torch.arange(256) // 32).to(torch.int32)
    g_idx[:40] = 0
    g_idx[40:64] = torch.randperm(24).to(torch.int32) % 7 + 1
    weight = quantized(torch.randn(384, 256), 32, symmetric=False)
    weight.g_idx = g_idx
    with pytest.raises(BuildError, match="exactly 32 input features"):
        run_pass("onnx_export", capture(one_layer(weight), SPEC, DIMS), tmp_path)
