from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.core.pass_api import PassContext
from infopt.core.target import get_target
from infopt.kernels import w4a16
from infopt.passes.fx.int4_kernels import PASS
from infopt.quantize.int4_format import Int4Linear, Int4Weight, grid, quantize_codes, replace_module
from tests.support.passes import capture, ops

INT4 = "infopt.int4_linear.default"
W4A16 = "infopt.w4a16_linear.default"
TOLERANCE = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


def int4_weight(linear: nn.Linear, group_size: int, symmetric: bool, act_order: bool) -> Int4Weight:
    """Round-to-nearest INT4 of ``linear``; with ``act_order`` the groups gather features in a random order."""
    w = linear.weight.detach().float()
    n, k = w.shape
    g_idx = torch.arange(k) // group_size
    if act_order:
        g_idx = g_idx[torch.randperm(k)]
    order = torch.argsort(g_idx, stable=True)
    grouped = w[:, order].reshape(-1, group_size)
    scale, zero = grid(grouped, symmetric)
    codes = torch.empty(n, k)
    codes[:, order] = quantize_codes(grouped, scale, zero).reshape(n, k)
    return Int4Weight.from_codes(codes, scale.reshape(n, -1), zero.reshape(n, -1), group_size, symmetric,
                                 g_idx if act_order else None)


class Cast(nn.Module):
    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype)


def quantized_mlp(dtype: torch.dtype = torch.float16) -> nn.Sequential:
    """float32 input cast to ``dtype`` (sample inputs cannot be bfloat16), then three INT4 Linears."""
    torch.manual_seed(0)
    model = nn.Sequential(Cast(dtype), nn.Linear(96, 64), nn.ReLU(), nn.Linear(64, 64, bias=False), nn.GELU(),
                          nn.Linear(64, 24))
    layers = {"1": (32, True, False), "3": (32, False, True), "5": (64, False, False)}
    for name, (group_size, symmetric, act_order) in layers.items():
        linear = model.get_submodule(name)
        replace_module(model, name, Int4Linear(int4_weight(linear, group_size, symmetric, act_order), linear.bias))
    assert model[3].g_idx is not None and model[1].g_idx is None
    return model.eval()


def run(artifact, target: str, tmp_path, **options):
    return PASS.run(artifact, PASS.parse_options(options), PassContext(get_target(target), tmp_path))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_swaps_every_int4_linear(tmp_path, dtype):
    art = capture(quantized_mlp(dtype), "x:float32[batch,96]")
    assert ops(art.obj)[INT4] == 3 and ops(art.obj)[W4A16] == 0
    x = torch.randn(5, 96)
    expected = art.obj.module()(x)
    outcome = run(art, "cpu", tmp_path, when="always")
    program = outcome.artifact.obj
    assert outcome.changed and outcome.details.swapped == 3 and outcome.details.kept == 0
    assert ops(program)[INT4] == 0 and ops(program)[W4A16] == 3
    assert outcome.notes[0] == "swapped 3 infopt.int4_linear -> infopt.w4a16_linear (weights in the kernel layout)"
    got = program.module()(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), **TOLERANCE[dtype])
    torch.export.save(program, tmp_path / "swapped.pt2")
    loaded = torch.export.load(tmp_path / "swapped.pt2")
    assert ops(loaded)[W4A16] == 3
    assert torch.equal(loaded.module()(x), got)


def test_weights_are_rewritten_into_the_kernel_layout(tmp_path):
    """Each swapped node's qweight is reordered (same shape and dtype), act-order's g_idx becomes the
    permutation; both round-trip to the module's own packed weight."""
    from infopt.kernels.w4a16_layout import from_kernel_layout
    from infopt.passes.fx.graph_utils import lifted_store

    model = quantized_mlp()
    art = capture(model, "x:float32[batch,96]")
    outcome = run(art, "h100", tmp_path)
    program = outcome.artifact.obj
    nodes = [n for n in program.graph.nodes if n.op == "call_function" and n.target == w4a16.registered().default]
    for node, layer in zip(nodes, (model[1], model[3], model[5])):
        store, key = lifted_store(program, node.args[1])
        qweight = store[key]
        assert qweight.shape == layer.qweight.shape and qweight.dtype == torch.uint8
        assert not torch.equal(qweight, layer.qweight)
        perm = None
        if layer.g_idx is not None:
            perm_store, perm_key = lifted_store(program, node.args[4])
            perm = perm_store[perm_key]
        packed, g_idx = from_kernel_layout(qweight, perm, layer.group_size)
        assert torch.equal(packed, layer.qweight)
        assert (g_idx is None and layer.g_idx is None) or torch.equal(g_idx, layer.g_idx)


def test_a_weight_the_kernel_layout_cannot_hold_keeps_the_portable_op(tmp_path):
    torch.manual_seed(1)
    model = nn.Sequential(Cast(torch.float16), nn.Linear(96, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    replace_module(model, "1", Int4Linear(int4_weight(model[1], 32, True, False), model[1].bias))
    replace_module(model, "3", Int4Linear(int4_weight(model[3], 16, False, False), model[3].bias))
    art = capture(model, "x:float32[batch,96]")
    x = torch.randn(4, 96)
    expected = art.obj.module()(x)
    outcome = run(art, "h100", tmp_path)
    program = outcome.artifact.obj
    assert ops(program)[W4A16] == 1 and ops(program)[INT4] == 1
    assert outcome.details.kept == 1
    assert any("group size 16: the W4A16 kernel takes a power of two of at least 32" in n for n in outcome.notes)
    torch.testing.assert_close(program.module()(x).float(), expected.float(), **TOLERANCE[torch.float16])


def test_cuda_target_swaps_by_default(tmp_path):
    art = capture(quantized_mlp(), "x:float32[batch,96]")
    outcome = run(art, "h100", tmp_path)
    assert outcome.changed and ops(outcome.artifact.obj)[W4A16] == 3


def test_cpu_target_changes_nothing_by_default(tmp_path):
    art = capture(quantized_mlp(), "x:float32[batch,96]")
    before = ops(art.obj)
    x = torch.randn(3, 96)
    expected = art.obj.module()(x)
    outcome = run(art, "cpu", tmp_path)
    assert not outcome.changed and outcome.details.swapped == 0
    assert ops(outcome.artifact.obj) == before and before[INT4] == 3
    assert "stays the portable op" in outcome.notes[0] and "runs on cpu" in outcome.notes[0]
    assert torch.equal(outcome.artifact.obj.module()(x), expected)


def test_float32_activations_keep_the_portable_op(tmp_path):
    art = capture(quantized_mlp(torch.float32), "x:float32[batch,96]")
    outcome = run(art, "cpu", tmp_path, when="always")
    assert not outcome.changed and outcome.details.kept == 3
    assert ops(outcome.artifact.obj)[INT4] == 3 and ops(outcome.artifact.obj)[W4A16] == 0
    assert any("activations are float32" in note for note in outcome.notes)
