"""The calibration forwards of a bf16 model: in float32 one block at a time where bf16 products are emulated, its
weights back in bf16 bit for bit after, and the next block's inputs in the model's own dtype."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.core.cpu_features import bf16_products_fast
from infopt.quantize.calib_forwards import block_outputs, float32_where_slow


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 8))  # float32 in a bf16 model, as rotary's

    def forward(self, x, scale=None):
        return (self.linear(x) * (1.0 if scale is None else scale[0]),)


@pytest.fixture
def block():
    torch.manual_seed(0)
    module = Block().to(torch.bfloat16)
    module.inv_freq = module.inv_freq.float()
    return module


def test_a_bf16_block_computes_in_float32_only_where_bf16_is_slow_and_comes_back_bit_for_bit(block):
    before = block.linear.weight.detach().clone()
    with float32_where_slow(block) as cast:
        inside = block.linear.weight.dtype
        assert block.inv_freq.dtype == torch.float32
        assert cast(torch.ones(2, dtype=torch.bfloat16)).dtype == inside
        assert cast(torch.ones(2, dtype=torch.int64)).dtype == torch.int64
    assert inside == (torch.bfloat16 if bf16_products_fast("cpu") else torch.float32)
    assert block.linear.weight.dtype == torch.bfloat16 and torch.equal(block.linear.weight, before)
    assert block.inv_freq.dtype == torch.float32


def test_the_next_blocks_inputs_keep_the_models_dtype_and_match_a_float32_forward(block):
    x = torch.randn(3, 16).to(torch.bfloat16)
    scale = (torch.tensor(2.0, dtype=torch.bfloat16),)
    (args, kwargs), = block_outputs(block, [((x,), {"scale": scale})])
    assert args[0].dtype == torch.bfloat16 and kwargs["scale"] is scale
    expected = torch.nn.functional.linear(x.float(), block.linear.weight.float(), block.linear.bias.float()) * 2
    tolerance = 0.05 if bf16_products_fast("cpu") else 0.01  # float32 products, one bf16 rounding at the end
    assert torch.allclose(args[0].float(), expected, rtol=tolerance, atol=tolerance)
