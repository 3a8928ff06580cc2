from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.errors import CaptureError
from infopt.inputspec import InputSpec
from tests.bad_models import DataDependent
from tests.passes.helpers import capture


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = DataDependent()

    def forward(self, x):
        return self.inner(x) + 1


def test_data_dependent_branch_names_module_and_line():
    with pytest.raises(CaptureError) as err:
        capture(Outer(), "x:float32[batch,4]")
    text = str(err.value)
    assert "data-dependent control flow" in text
    assert "DataDependent at inner" in text
    assert "bad_models.py" in text and "if y.mean() > 0" in text
    assert "torch.cond" in text or "torch.where" in text


def test_specialized_dynamic_dim_is_explained():
    class Fixed(nn.Module):
        def forward(self, x):
            return x.reshape(8, -1)  # fixes the batch dim to 8

    with pytest.raises(CaptureError) as err:
        capture(Fixed(), "x:float32[batch,4]", ["batch=2:8:16"])
    assert "declare that dim as an int" in str(err.value) or "batch" in str(err.value)


def test_dynamic_dims_become_ranges():
    art = capture(nn.Linear(4, 2), "x:float32[batch,4]", ["batch=1:8:32"])
    ranges = [(int(r.lower), int(r.upper)) for r in art.obj.range_constraints.values()]
    assert (1, 32) in ranges or (2, 32) in ranges
    out = art.obj.module()(torch.randn(17, 4))
    assert out.shape == (17, 2)
    assert isinstance(art.spec, InputSpec)
