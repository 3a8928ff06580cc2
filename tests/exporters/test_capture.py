from __future__ import annotations

import pytest
import torch
from torch import nn

from infopt.core.errors import CaptureError
from infopt.core.inputspec import InputSpec
from tests.support.bad_models import DataDependent
from tests.support.passes import capture


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


class HeadSplit(nn.Module):
    """Size arithmetic a trace records in tensors: the head split of attention, and a slice by length."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 16, 8))
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        b, n, d = x.shape
        heads = self.proj(x + self.pos[:, :n]).reshape(b, n, 2, d // 2).transpose(1, 2)
        return heads.reshape(b * 2, n, d // 2).softmax(-1).sum(1)


def test_torchscript_size_arithmetic_becomes_integer_arithmetic():
    """Traced at batch 2 and length 6, the TorchScript model is captured for the whole declared range:
    without the fold the converter's assertions from the trace (u >= 8 and the like) refuse batch 1."""
    from torch._export.converter import TS2EPConverter

    from infopt.exporters.torchscript_graph import fold_size_arithmetic

    model = HeadSplit().eval()
    example = (torch.randn(2, 6, 8),)
    traced = torch.jit.trace(model, example, check_trace=False)
    converted = TS2EPConverter(traced, example).convert().module()
    scalars = [n for n in converted.graph.nodes if str(n.target) == "aten._local_scalar_dense.default"]
    assert scalars  # what the fold is for: sizes turned into data-dependent integers
    assert fold_size_arithmetic(converted) == len(scalars)
    assert not [n for n in converted.graph.nodes if "_local_scalar_dense" in str(n.target) or "_assert_scalar" in str(n.target)]

    program = capture(traced, "x:float32[batch,seq,8]", ["batch=1:2:8", "seq=1:6:16"]).obj
    for shape in ((1, 1, 8), (8, 16, 8), (3, 5, 8)):
        x = torch.randn(shape)
        with torch.inference_mode():
            assert torch.allclose(program.module()(x), model(x), atol=1e-5), shape
