"""The INT4 layer plan: one group size for a checkpoint, and transformers' Conv1D as the Linear it is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.quantize.int4_config import RTNConfig
from infopt.quantize.int4_format import conv1d_as_linear
from infopt.quantize.weight_only import plan_layers


def widths(*features):
    return nn.Sequential(*[nn.Linear(f, 8) for f in features])


def test_each_layer_takes_its_own_size_unless_one_is_asked_for():
    model = widths(256, 576, 96, 20)
    plan = plan_layers(model, RTNConfig(group_size=128))
    assert [plan.group_sizes.get(str(i)) for i in range(4)] == [128, 64, 32, None]
    assert "20 input features" in plan.kept["3"]
    uniform = plan_layers(model, RTNConfig(group_size=128), uniform=True)
    assert set(uniform.group_sizes.values()) == {32} and list(uniform.kept) == ["3"]
    assert set(plan_layers(widths(576, 960), RTNConfig(group_size=128), uniform=True).group_sizes.values()) == {64}


def test_conv1d_becomes_the_linear_that_computes_the_same():
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = nn.Sequential(Conv1D(24, 16), nn.ReLU(), Conv1D(8, 24))
    x = torch.randn(3, 5, 16)
    want = model(x)
    assert conv1d_as_linear(model) == ["0", "2"]
    assert all(type(model[i]) is nn.Linear for i in (0, 2)) and model[0].in_features == 16
    torch.testing.assert_close(model(x), want, rtol=1e-6, atol=1e-6)
