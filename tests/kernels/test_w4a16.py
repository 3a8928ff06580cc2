"""The W4A16 Triton kernel against its torch reference (on CPU under TRITON_INTERPRET=1), its weight
layout, the op and the module that calls it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.kernels import w4a16
from infopt.kernels.w4a16 import (
    W4A16Linear,
    check_inputs,
    use_w4a16_kernels,
    w4a16_linear,
    w4a16_linear_torch,
    w4a16_linear_triton,
)
from infopt.kernels.w4a16_layout import from_kernel_layout, split_halves, to_kernel_layout, unsupported
from infopt.quantize.int4_format import Int4Linear, Int4Weight, int4_linear_torch, pack_int4

TOLERANCE = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=4e-2, rtol=4e-2)}
GROUPS = [(32, 96), (64, 192), (128, 384)]
"""(group size, K): K a multiple of the group size and not a power of two."""


def canonical(N, K, group_size, *, symmetric=True, act_order=False, seed=0):
    """Random codes in infopt's packed format, dequantized entries with std about ``1 / sqrt(K)``."""
    gen = torch.Generator().manual_seed(seed)
    groups = K // group_size
    codes = torch.randint(0, 16, (N, K), generator=gen)
    scales = (torch.rand(N, groups, generator=gen) + 0.5) / (5 * K ** 0.5)
    zeros = torch.full((N, groups), 8) if symmetric else torch.randint(0, 16, (N, groups), generator=gen)
    g_idx = (torch.arange(K) // group_size)[torch.randperm(K, generator=gen)].to(torch.int32) if act_order else None
    return pack_int4(codes), scales, zeros.to(torch.uint8), g_idx


def case(M, N, K, group_size, dtype, *, bias=False, symmetric=True, act_order=False, lead=(), device="cpu", seed=0):
    """The kernel's arguments (weight in the kernel layout) on ``device``."""
    qweight, scales, zeros, g_idx = canonical(N, K, group_size, symmetric=symmetric, act_order=act_order, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(*lead, M, K, generator=gen).to(dtype)
    b = torch.randn(N, generator=gen) if bias else None
    packed, perm = to_kernel_layout(qweight, g_idx, group_size)
    tensors = [x, packed, scales, zeros, perm, b]
    return [t.to(device) if t is not None else None for t in tensors] + [group_size]


def assert_matches(out, args):
    ref = w4a16_linear_torch(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args])
    assert out.dtype == args[0].dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().float(), ref.float(), **TOLERANCE[ref.dtype])


def test_layout_puts_each_groups_halves_in_the_two_nibbles():
    codes = torch.arange(64).remainder(16).reshape(1, 64)
    packed = split_halves(codes, 32)
    assert packed.shape == (1, 32)
    assert torch.equal(packed[0] & 0xF, torch.cat([codes[0, :16], codes[0, 32:48]]).to(torch.uint8))
    assert torch.equal(packed[0] >> 4, torch.cat([codes[0, 16:32], codes[0, 48:]]).to(torch.uint8))


@pytest.mark.parametrize("act_order", [False, True], ids=["in-order", "act-order"])
@pytest.mark.parametrize("group_size,K", GROUPS)
def test_layout_round_trips_exactly(group_size, K, act_order):
    qweight, _, _, g_idx = canonical(24, K, group_size, act_order=act_order)
    packed, perm = to_kernel_layout(qweight, g_idx, group_size)
    assert packed.shape == qweight.shape and packed.dtype == torch.uint8
    assert not torch.equal(packed, qweight), "the layout is not the packed format"
    if act_order:
        assert perm.dtype == torch.int32 and torch.equal(g_idx[perm.long()], torch.arange(K) // group_size)
    back, g_back = from_kernel_layout(packed, perm, group_size)
    assert torch.equal(back, qweight)
    assert (g_back is None) == (g_idx is None) and (g_idx is None or torch.equal(g_back, g_idx))


def test_layout_says_what_it_cannot_hold():
    assert "power of two of at least 32" in unsupported(96, 16, None)
    assert "power of two of at least 32" in unsupported(96, 48, None)
    assert "does not divide the 96" in unsupported(96, 64, None)
    uneven = (torch.arange(128) // 32).to(torch.int32)
    uneven[0] = 1
    assert "not all of the group size" in unsupported(128, 32, uneven)
    assert unsupported(128, 32, (torch.arange(128) // 32).flip(0).to(torch.int32)) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("group_size,K", GROUPS)
@pytest.mark.parametrize("M", [1, 3, 17, 40])
@pytest.mark.parametrize("symmetric,bias", [(True, True), (False, False)], ids=["sym-bias", "asym-nobias"])
def test_matches_reference(device, M, K, group_size, dtype, bias, symmetric):
    args = case(M, 40, K, group_size, dtype, bias=bias, symmetric=symmetric, device=device)
    assert_matches(w4a16_linear_triton(*args), args)


@pytest.mark.parametrize("N", [24, 72])
def test_output_features_that_no_tile_divides(device, N):
    args = case(5, N, 128, 64, torch.float16, bias=True, symmetric=False, device=device, seed=4)
    assert_matches(w4a16_linear_triton(*args), args)


@pytest.mark.parametrize("M", [1, 17])
@pytest.mark.parametrize("group_size,K", [(32, 96), (128, 384)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_act_order(device, M, group_size, K, dtype):
    args = case(M, 24, K, group_size, dtype, bias=True, symmetric=False, act_order=True, device=device, seed=2)
    out = w4a16_linear_triton(*args)
    assert_matches(out, args)
    without = w4a16_linear_triton(*args[:4], None, *args[5:])
    assert (out.float() - without.float()).abs().max() > 0.1, "the kernel ignored perm"


def test_leading_dims_strided_rows_and_empty_input(device):
    args = case(3, 24, 96, 32, torch.float16, lead=(2,), device=device)
    out = w4a16_linear_triton(*args)
    assert out.shape == (2, 3, 24)
    assert_matches(out, args)
    wide = torch.randn(4, 160).half().to(device)
    strided = [wide[:, 32:128], *args[1:]]
    assert strided[0].stride(0) == 160
    assert_matches(w4a16_linear_triton(*strided), strided)
    empty = w4a16_linear_triton(args[0][:, :0], *args[1:])
    assert empty.shape == (2, 0, 24)


def test_the_packed_format_is_not_taken_for_the_layout(device):
    """The tolerance tells a real bug apart: the same weight in infopt's packed format does not match."""
    args = case(3, 24, 192, 64, torch.float16, device=device, seed=3)
    canonical_bytes = from_kernel_layout(args[1].cpu(), None, 64)[0].to(device)
    out = w4a16_linear_triton(args[0], canonical_bytes, *args[2:])
    with pytest.raises(AssertionError):
        assert_matches(out, args)


def test_interpreter_runs_the_kernel(device):
    if device != "cpu":
        pytest.skip("kernels run on the GPU here, not in the interpreter")
    assert w4a16.interpreting()
    assert type(w4a16._w4a16_kernel).__name__ == "InterpretedFunction"


def test_bad_inputs(device):
    x, qweight, scales, zeros, _, bias, g = case(2, 24, 96, 32, torch.float16, bias=True, device=device)
    with pytest.raises(ValueError, match="float16 or bfloat16, got torch.float32"):
        check_inputs(x.float(), qweight, scales, zeros, None, bias, g)
    with pytest.raises(ValueError, match="K mismatch: x has K=64"):
        check_inputs(x[:, :64], qweight, scales, zeros, None, bias, g)
    with pytest.raises(ValueError, match="zeros must be a uint8 tensor"):
        check_inputs(x, qweight, scales, zeros.float(), None, bias, g)
    with pytest.raises(ValueError, match=r"bias must be a float tensor \[24\]"):
        check_inputs(x, qweight, scales, zeros, None, bias[:5], g)
    with pytest.raises(ValueError, match="does not divide the 96 input features"):
        check_inputs(x, qweight, scales, zeros, None, bias, 64)
    with pytest.raises(ValueError, match="power of two of at least 32"):
        check_inputs(x, qweight, scales, zeros, None, bias, 16)
    with pytest.raises(ValueError, match=r"perm must be an int32 tensor \[96\]"):
        check_inputs(x, qweight, scales, zeros, torch.zeros(95, dtype=torch.int32, device=device), bias, g)
    with pytest.raises(ValueError, match="qweight must be contiguous"):
        check_inputs(x, torch.cat([qweight, qweight], 1)[:, ::2], scales, zeros, None, bias, g)
    with pytest.raises(ValueError, match="K mismatch"):
        w4a16_linear_triton(x[:, :64], qweight, scales, zeros, None, bias, g)


def test_reference_is_int4_linear_in_fp32():
    qweight, scales, zeros, g_idx = canonical(24, 192, 64, symmetric=False, act_order=True)
    x, bias = torch.randn(5, 192), torch.randn(24)
    packed, perm = to_kernel_layout(qweight, g_idx, 64)
    assert torch.equal(w4a16_linear_torch(x, packed, scales, zeros, perm, bias, 64),
                       int4_linear_torch(x, qweight, scales, zeros, g_idx, bias, 64))


def test_op_passes_opcheck():
    args = case(3, 24, 96, 32, torch.bfloat16, bias=True, act_order=True)
    assert torch.equal(w4a16_linear(*args), w4a16_linear_torch(*args))
    torch.library.opcheck(w4a16.registered().default, tuple(args))


def test_direct_launch_only_for_eager_cuda_tensors_without_gradients():
    x = torch.randn(2, 64).half()
    assert not w4a16._launches_directly(x), "CPU tensors go through the op (the reference)"
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert not w4a16._launches_directly(torch.empty(2, 64, dtype=torch.float16))


def quantized_layer(K=128, N=48, group_size=64, act_order=False, bias=True, input_scale=False, seed=0):
    qweight, scales, zeros, g_idx = canonical(N, K, group_size, symmetric=False, act_order=act_order, seed=seed)
    weight = Int4Weight(qweight, scales, zeros, group_size, False, g_idx,
                        torch.rand(K) + 0.5 if input_scale else None)
    return Int4Linear(weight, torch.randn(N) if bias else None)


@pytest.mark.parametrize("act_order,input_scale", [(False, False), (True, False), (False, True)],
                         ids=["plain", "act-order", "awq-scales"])
def test_module_in_the_kernel_layout_computes_what_int4_linear_does(act_order, input_scale):
    layer = quantized_layer(act_order=act_order, input_scale=input_scale)
    fast = W4A16Linear.from_int4(layer)
    assert fast.in_features == 128 and fast.out_features == 48 and (fast.perm is not None) == act_order
    x = torch.randn(3, 128).half()
    torch.testing.assert_close(fast(x).float(), layer(x.float()).half().float(), **TOLERANCE[torch.float16])


def test_kernels_swapped_into_a_model_where_the_layout_fits():
    model = nn.Sequential(quantized_layer(K=128, N=64), nn.ReLU(), quantized_layer(K=64, N=32, group_size=64, seed=1))
    odd = quantized_layer(K=96, N=16, group_size=16, seed=2)
    model.append(nn.ReLU())
    model.append(nn.Linear(32, 96))
    model.append(odd)
    x = torch.randn(4, 128)
    expected = model(x)
    kept = use_w4a16_kernels(model)
    assert isinstance(model[0], W4A16Linear) and isinstance(model[2], W4A16Linear)
    assert isinstance(model[5], Int4Linear) and list(kept) == ["5"] and "group size 16" in kept["5"]
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


class Quantized(nn.Module):
    def __init__(self, args):
        super().__init__()
        for name, value in zip(("qweight", "scales", "zeros", "perm", "bias"), args[1:6]):
            self.register_buffer(name, value)
        self.group_size = args[6]

    def forward(self, x):
        y = w4a16_linear(x, self.qweight, self.scales, self.zeros, self.perm, self.bias, self.group_size)
        return torch.relu(y)


def test_op_exports_as_one_node():
    args = case(4, 24, 96, 32, torch.float16, bias=True, symmetric=False, act_order=True)
    module = Quantized(args).eval()
    program = torch.export.export(module, (args[0],))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(w4a16.registered().default) == 1
    x = torch.randn(4, 96).half()
    assert torch.equal(program.module()(x), module(x))
