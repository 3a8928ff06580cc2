"""RMSNorm and LayerNorm Triton kernels against their torch references, and their ops."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.kernels.norms import (
    layer_norm,
    layer_norm_torch,
    layer_norm_triton,
    norm_config,
    rms_norm,
    rms_norm_torch,
    rms_norm_triton,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
TOLERANCE = {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
             torch.float32: dict(atol=1e-5, rtol=1e-5)}
HIDDEN = [1, 37, 64, 96, 130, 257]
"""Under the interpreter rows above 64 take the chunked path (two or more chunks, the last partial)."""


def inputs(rows, hidden, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=gen) * 3 + 1).to(dtype)
    weight = torch.randn(hidden, generator=gen)
    bias = torch.randn(hidden, generator=gen).to(dtype)
    return x.to(device), weight.to(device), bias.to(device)


def close(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().float(), ref.cpu().float(), **TOLERANCE[ref.dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [1, 5])
def test_rms_norm_matches_reference(device, rows, hidden, dtype):
    x, weight, _ = inputs(rows, hidden, dtype, device)
    close(rms_norm_triton(x, weight, 1e-6), rms_norm_torch(x.cpu(), weight.cpu(), 1e-6))
    close(rms_norm_triton(x, None, 1e-6), rms_norm_torch(x.cpu(), None, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("rows", [1, 5])
def test_layer_norm_matches_reference(device, rows, hidden, dtype):
    x, weight, bias = inputs(rows, hidden, dtype, device, seed=1)
    close(layer_norm_triton(x, weight, bias, 1e-5), layer_norm_torch(x.cpu(), weight.cpu(), bias.cpu(), 1e-5))
    close(layer_norm_triton(x, None, None, 1e-5), layer_norm_torch(x.cpu(), None, None, 1e-5))


def test_references_match_torch():
    x, weight, bias = inputs(4, 96, torch.float32, "cpu")
    torch.testing.assert_close(layer_norm_torch(x, weight, bias, 1e-5),
                               nn.functional.layer_norm(x, (96,), weight, bias.float(), 1e-5))
    torch.testing.assert_close(rms_norm_torch(x, weight, 1e-6), nn.functional.rms_norm(x, (96,), weight, 1e-6))


def test_config_covers_both_paths():
    """Under the interpreter rows of 64 stay in one block and longer rows are chunked; on a GPU the
    whole row fits up to 8192 elements."""
    assert norm_config(37, interpret=True) == dict(BLOCK=64, ONE_BLOCK=True, num_warps=1)
    assert norm_config(130, interpret=True)["ONE_BLOCK"] is False
    assert norm_config(130, interpret=False)["ONE_BLOCK"] is True
    assert norm_config(8192, interpret=False) == dict(BLOCK=8192, ONE_BLOCK=True, num_warps=16)
    assert norm_config(11008, interpret=False) == dict(BLOCK=4096, ONE_BLOCK=False, num_warps=16)


def test_leading_dims_and_strided_input(device):
    x, weight, bias = inputs(6, 40, torch.float16, device, seed=2)
    x3 = x.reshape(2, 3, 40)
    out = layer_norm_triton(x3, weight, bias, 1e-5)
    assert out.shape == (2, 3, 40)
    close(out, layer_norm_torch(x3.cpu(), weight.cpu(), bias.cpu(), 1e-5))
    strided = torch.cat([x, x], dim=1)[:, ::2]
    close(rms_norm_triton(strided, weight, 1e-6), rms_norm_torch(strided.cpu(), weight.cpu(), 1e-6))


@pytest.mark.parametrize("hidden", [37, 130])
def test_layer_norm_keeps_precision_under_a_large_mean(device, hidden):
    """Rows offset by 1000 (fp32 spacing there 6e-5) still match the reference to 1e-3: a variance taken
    as ``E[x^2] - E[x]^2`` would lose about 1% of it to cancellation (1e6 * 6e-8 against 9)."""
    x, weight, bias = inputs(3, hidden, torch.float32, device, seed=3)
    x = x + 1000
    out = layer_norm_triton(x, weight, bias, 1e-5)
    ref = layer_norm_torch(x.cpu(), weight.cpu(), bias.cpu(), 1e-5)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-3, rtol=1e-3)


def test_bad_inputs(device):
    x, weight, bias = inputs(2, 37, torch.float16, device)
    with pytest.raises(ValueError, match="float16, bfloat16 or float32, got torch.int64"):
        rms_norm_triton(x.long(), weight, 1e-6)
    with pytest.raises(ValueError, match=r"weight must be a float tensor \[37\]"):
        rms_norm_triton(x, weight[:36], 1e-6)
    with pytest.raises(ValueError, match=r"bias must be a float tensor \[37\]"):
        layer_norm_triton(x, weight, bias.long(), 1e-5)


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.rms = nn.Parameter(torch.randn(hidden))
        self.ln_w = nn.Parameter(torch.randn(hidden))
        self.ln_b = nn.Parameter(torch.randn(hidden))

    def forward(self, x):
        return layer_norm(rms_norm(x, self.rms) * 2, self.ln_w, self.ln_b)


def test_ops_export_as_one_node_each():
    module = Block(48).eval()
    x = torch.randn(2, 5, 48)
    program = torch.export.export(module, (x,))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.infopt.rms_norm.default) == 1
    assert targets.count(torch.ops.infopt.layer_norm.default) == 1
    y = torch.randn(2, 5, 48)
    assert torch.equal(program.module()(y), module(y))
    expected = layer_norm_torch(rms_norm_torch(y, module.rms) * 2, module.ln_w, module.ln_b)
    assert torch.equal(module(y), expected)


def test_ops_pass_opcheck():
    x, weight, bias = inputs(3, 37, torch.bfloat16, "cpu")
    torch.library.opcheck(torch.ops.infopt.rms_norm.default, (x, weight, 1e-6))
    torch.library.opcheck(torch.ops.infopt.layer_norm.default, (x, weight, bias, 1e-5))
    assert torch.equal(rms_norm(x, weight), rms_norm_torch(x, weight))
