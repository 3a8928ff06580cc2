from __future__ import annotations

import torch
from torch import nn

from infopt.validators.metrics import max_abs
from tests.support.passes import capture, ops, run_pass, saved_and_checked


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.5)
        self.ident = nn.Identity()
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        y = self.ident(self.drop(torch.relu(self.a(x))))
        return self.b(y.clone().detach())


def test_removes_dropout_and_copies(tmp_path):
    torch.manual_seed(0)
    art = capture(Noisy(), "x:float32[batch,6]")
    before = ops(art.obj)
    assert before["aten.dropout.default"] == 1 and before["aten.clone.default"] == 1
    x = torch.randn(7, 6)
    expected = art.obj.module()(x)
    outcome = run_pass("remove_noops", art, tmp_path)
    after = ops(outcome.artifact.obj)
    assert outcome.changed
    for op in ("aten.dropout.default", "aten.clone.default", "aten.detach.default", "aten.alias.default"):
        assert after[op] == 0, op
    assert after["aten.linear.default"] == 2
    assert max_abs(expected.detach().numpy(), outcome.artifact.obj.module()(x).detach().numpy()) == 0.0
    saved_and_checked(outcome.artifact.obj, art.spec, tmp_path / "clean.onnx")


def test_keep_clones_option(tmp_path):
    art = capture(Noisy(), "x:float32[batch,6]")
    outcome = run_pass("remove_noops", art, tmp_path, keep_clones=True)
    after = ops(outcome.artifact.obj)
    assert after["aten.dropout.default"] == 0 and after["aten.clone.default"] == 1


def test_nothing_to_remove_reports_unchanged(tmp_path):
    art = capture(nn.Linear(3, 2), "x:float32[batch,3]")
    outcome = run_pass("remove_noops", art, tmp_path)
    assert not outcome.changed and outcome.notes == ["no no-op found"]
