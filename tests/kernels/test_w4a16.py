"""The W4A16 Triton kernel against its torch reference (on CPU under TRITON_INTERPRET=1), and the op."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.kernels import w4a16
from infopt.kernels.w4a16 import w4a16_linear, w4a16_linear_torch, w4a16_linear_triton
from infopt.quantize.int4_format import pack_int4, unpack_int4

TOLERANCE = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=4e-2, rtol=4e-2)}
GROUPS = [(32, 96), (64, 192), (128, 384)]
"""(group size, K): K a multiple of the group size and not a power of two."""


def case(M, N, K, group_size, dtype, *, bias=False, symmetric=True, act_order=False, lead=(), device="cpu", seed=0):
    """Random packed weights whose dequantized entries have std about ``1 / sqrt(K)``, so ``y`` is O(1)."""
    gen = torch.Generator().manual_seed(seed)
    groups = K // group_size
    codes = torch.randint(0, 16, (N, K), generator=gen)
    scales = (torch.rand(N, groups, generator=gen) + 0.5) / (5 * K ** 0.5)
    zeros = torch.full((N, groups), 8) if symmetric else torch.randint(0, 16, (N, groups), generator=gen)
    zeros = zeros.to(torch.uint8)
    g_idx = (torch.arange(K) // group_size)[torch.randperm(K, generator=gen)].to(torch.int32) if act_order else None
    x = torch.randn(*lead, M, K, generator=gen).to(dtype)
    b = torch.randn(N, generator=gen) if bias else None
    tensors = [x, pack_int4(codes), scales, zeros, g_idx, b]
    return [t.to(device) if t is not None else None for t in tensors] + [group_size]


def assert_matches(out, args):
    ref = w4a16_linear_torch(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    assert out.dtype == args[0].dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().float(), ref.float(), **TOLERANCE[ref.dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("group_size,K", GROUPS)
@pytest.mark.parametrize("N", [24, 40])
@pytest.mark.parametrize("M", [1, 3, 17])
@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_reference(device, M, N, K, group_size, dtype, bias, symmetric):
    args = case(M, N, K, group_size, dtype, bias=bias, symmetric=symmetric, device=device)
    assert_matches(w4a16_linear_triton(*args), args)


@pytest.mark.parametrize("variant", ["gemm", "splitk"])
@pytest.mark.parametrize("M", [3, 17])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_each_variant_at_small_and_large_m(device, variant, M, dtype):
    args = case(M, 40, 192, 64, dtype, bias=True, symmetric=False, device=device, seed=1)
    assert_matches(w4a16_linear_triton(*args, variant=variant), args)


@pytest.mark.parametrize("M", [1, 17])
@pytest.mark.parametrize("group_size,K", [(32, 96), (128, 384)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_act_order(device, M, group_size, K, dtype):
    args = case(M, 24, K, group_size, dtype, bias=True, symmetric=False, act_order=True, device=device, seed=2)
    out = w4a16_linear_triton(*args)
    assert_matches(out, args)
    without = w4a16_linear_triton(*args[:4], None, *args[5:])
    assert (out.float() - without.float()).abs().max() > 0.1, "the kernel ignored g_idx"


def test_leading_dims_and_empty_input(device):
    args = case(3, 24, 96, 32, torch.float16, lead=(2,), device=device)
    out = w4a16_linear_triton(*args)
    assert out.shape == (2, 3, 24)
    assert_matches(out, args)
    empty = w4a16_linear_triton(args[0][:, :0], *args[1:])
    assert empty.shape == (2, 0, 24)


def test_wrong_nibble_order_is_caught(device):
    """The tolerance tells a real bug apart: the same codes with their nibbles swapped do not match."""
    args = case(3, 24, 192, 64, torch.float16, device=device, seed=3)
    swapped = pack_int4(unpack_int4(args[1].cpu()).reshape(24, -1, 2).flip(-1).reshape(24, -1)).to(device)
    out = w4a16_linear_triton(args[0], swapped, *args[2:])
    with pytest.raises(AssertionError):
        assert_matches(out, args)


def test_interpreter_runs_the_kernel(device):
    if device != "cpu":
        pytest.skip("kernels run on the GPU here, not in the interpreter")
    assert w4a16.interpreting()
    assert type(w4a16._w4a16_gemm_kernel).__name__ == "InterpretedFunction"
    assert type(w4a16._w4a16_splitk_kernel).__name__ == "InterpretedFunction"


def test_bad_inputs(device):
    x, qweight, scales, zeros, g_idx, bias, g = case(2, 24, 96, 32, torch.float16, bias=True, device=device)
    with pytest.raises(ValueError, match="float16 or bfloat16, got torch.float32"):
        w4a16_linear_triton(x.float(), qweight, scales, zeros, g_idx, bias, g)
    with pytest.raises(ValueError, match="K mismatch: x has K=64"):
        w4a16_linear_triton(x[:, :64], qweight, scales, zeros, g_idx, bias, g)
    with pytest.raises(ValueError, match="zeros must be a uint8 tensor"):
        w4a16_linear_triton(x, qweight, scales, zeros.float(), g_idx, bias, g)
    with pytest.raises(ValueError, match=r"bias must be a float tensor \[24\]"):
        w4a16_linear_triton(x, qweight, scales, zeros, g_idx, bias[:5], g)
    with pytest.raises(ValueError, match="group_size 64 must be even and divide K=96"):
        w4a16_linear_triton(x, qweight, scales, zeros, g_idx, bias, 64)
    with pytest.raises(ValueError, match=r"g_idx must be an int32 tensor \[96\]"):
        w4a16_linear_triton(x, qweight, scales, zeros, torch.zeros(95, dtype=torch.int32, device=device), bias, g)


def test_reference_is_int4_linear_in_fp32():
    import infopt.quantize.int4_format  # noqa: F401

    args = case(5, 24, 192, 64, torch.float32, bias=True, symmetric=False, act_order=True)
    assert torch.equal(torch.ops.infopt.int4_linear(*args), w4a16_linear_torch(*args))


def test_op_passes_opcheck():
    args = case(3, 24, 96, 32, torch.bfloat16, bias=True)
    assert torch.equal(w4a16_linear(*args), w4a16_linear_torch(*args))
    torch.library.opcheck(torch.ops.infopt.w4a16_linear.default, tuple(args))


class Quantized(nn.Module):
    def __init__(self, args):
        super().__init__()
        for name, value in zip(("qweight", "scales", "zeros", "g_idx", "bias"), args[1:6]):
            self.register_buffer(name, value)
        self.group_size = args[6]

    def forward(self, x):
        y = w4a16_linear(x, self.qweight, self.scales, self.zeros, self.g_idx, self.bias, self.group_size)
        return torch.relu(y)


def test_op_exports_as_one_node():
    args = case(4, 24, 96, 32, torch.float16, bias=True, symmetric=False, act_order=True)
    module = Quantized(args).eval()
    program = torch.export.export(module, (args[0],))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.infopt.w4a16_linear.default) == 1
    x = torch.randn(4, 96).half()
    assert torch.equal(program.module()(x), module(x))
