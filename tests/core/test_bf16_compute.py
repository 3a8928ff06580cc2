"""A bf16 model computed in float32 one block at a time where bf16 products are emulated: its weights back in bf16
bit for bit after, what flows between blocks in the model's own dtype, and nothing changed where bf16 is fast. The
CPU's answer is forced both ways, so each branch runs on any machine."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.core import bf16_compute
from infopt.core.bf16_compute import blocks_of, float32_blocks, float32_where_slow
from infopt.quantize.calib_forwards import block_outputs


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, 8))  # float32 in a bf16 model, as rotary's

    def forward(self, x, scale=None):
        return (self.linear(x) * (1.0 if scale is None else scale[0]),)


@pytest.fixture(params=[False, True], ids=["bf16-slow", "bf16-fast"])
def fast(request, monkeypatch):
    monkeypatch.setattr(bf16_compute, "bf16_products_fast", lambda device="cpu": request.param)
    return request.param


@pytest.fixture
def block():
    torch.manual_seed(0)
    module = Block().to(torch.bfloat16)
    module.inv_freq = module.inv_freq.float()
    return module


def test_a_bf16_block_computes_in_float32_only_where_bf16_is_slow_and_comes_back_bit_for_bit(block, fast):
    before, storage = block.linear.weight.detach().clone(), block.linear.weight.data_ptr()
    with float32_where_slow(block) as cast:
        inside = block.linear.weight.dtype
        assert block.inv_freq.dtype == torch.float32
        assert cast(torch.ones(2, dtype=torch.bfloat16)).dtype == inside
        assert cast(torch.ones(2, dtype=torch.int64)).dtype == torch.int64
    assert inside == (torch.bfloat16 if fast else torch.float32)
    assert block.linear.weight.dtype == torch.bfloat16 and torch.equal(block.linear.weight, before)
    assert block.linear.weight.data_ptr() == storage  # the same tensor back: a checkpoint's mapped pages stay so
    assert block.inv_freq.dtype == torch.float32


def test_the_next_blocks_inputs_keep_the_models_dtype_and_match_a_float32_forward(block, fast):
    x = torch.randn(3, 16).to(torch.bfloat16)
    scale = (torch.tensor(2.0, dtype=torch.bfloat16),)
    (args, kwargs), = block_outputs(block, [((x,), {"scale": scale})])
    assert args[0].dtype == torch.bfloat16 and kwargs["scale"] is scale
    expected = torch.nn.functional.linear(x.float(), block.linear.weight.float(), block.linear.bias.float()) * 2
    tolerance = 0.05 if fast else 0.01  # float32 products, one bf16 rounding at the end
    assert torch.allclose(args[0].float(), expected, rtol=tolerance, atol=tolerance)


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def test_a_decoder_runs_each_layer_and_its_head_in_float32_and_generates_the_same_way(llama, fast):
    assert blocks_of(llama) == [*llama.model.layers, llama.lm_head]
    before = {name: p.detach().clone() for name, p in llama.named_parameters()}
    seen, where = [], []
    probes = [layer.mlp.register_forward_hook(lambda m, a, out: where.append(m.down_proj.weight.data_ptr()))
              for layer in llama.model.layers]
    probe = llama.model.layers[1].mlp.register_forward_hook(lambda m, a, out: seen.append(m.down_proj.weight.dtype))
    ids = torch.arange(1, 17)[None]
    with torch.no_grad():
        plain = llama(input_ids=ids).logits
        with float32_blocks(llama):
            upcast = llama(input_ids=ids).logits
            greedy = llama.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        exact = llama.float()(input_ids=ids).logits  # the same bf16 values, float32 products throughout
        llama.to(torch.bfloat16)
    probe.remove()
    for one in probes:
        one.remove()
    assert seen[1] == (torch.bfloat16 if fast else torch.float32)
    # float32 copies in memory reused block after block (the same offset in one workspace), where there are copies
    assert where[2:4] == where[:2] if fast else (where[2] == where[3] and where[2] not in where[:2])
    assert upcast.dtype == torch.bfloat16 and greedy.shape == (1, 20)
    # float32 products with a bf16 residual stream: closer to the float32 forward than bf16 products are, or the same
    error, plain_error = (upcast.float() - exact).abs().max(), (plain.float() - exact).abs().max()
    assert error <= plain_error if not fast else torch.equal(upcast, plain)
    assert all(torch.equal(p, before[name]) and p.dtype == torch.bfloat16 for name, p in llama.named_parameters())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in llama.modules())


def test_a_forward_that_raises_inside_a_layer_leaves_the_weights_in_bf16(llama, fast):
    def fail(module, args, output):
        raise RuntimeError("stopped inside the first layer")

    stop = llama.model.layers[0].mlp.register_forward_hook(fail)
    try:
        with torch.no_grad(), float32_blocks(llama), pytest.raises(RuntimeError, match="stopped inside"):
            llama(input_ids=torch.tensor([[1, 2, 3]]))
    finally:
        stop.remove()
    assert all(p.dtype == torch.bfloat16 for p in llama.parameters())
