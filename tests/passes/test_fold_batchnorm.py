from __future__ import annotations

import torch
from torch import nn

from infopt.validators.metrics import max_abs
from tests.support.passes import capture, ops, run_pass, saved_and_checked

BN = ("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default")


def _randomize_bn(model):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model


def test_fold_removes_batchnorm_keeps_numbers(digits, tmp_path):
    model = digits[0]
    art = capture(model, "x:float32[batch,1,8,8]")
    before = ops(art.obj)
    assert sum(before[b] for b in BN) == 2
    x = torch.from_numpy(digits[1]["val"][0][:32])
    expected = art.obj.module()(x)
    outcome = run_pass("fold_batchnorm", art, tmp_path)
    after = ops(outcome.artifact.obj)
    assert outcome.changed and sum(after[b] for b in BN) == 0
    assert after["aten.conv2d.default"] == 2
    # the folded BN's running stats are gone from the program's state
    assert not any("running_mean" in k for k in outcome.artifact.obj.state_dict)
    got = outcome.artifact.obj.module()(x)
    assert max_abs(expected.detach().numpy(), got.detach().numpy()) < 1e-5
    saved = saved_and_checked(outcome.artifact.obj, art.spec, tmp_path / "folded.onnx")
    assert "BatchNormalization" not in {n.op_type for n in saved.graph.node}
    # the eager model was not touched
    assert torch.allclose(model(x), expected, atol=1e-6)


def test_fold_without_conv_bias_and_random_stats(tmp_path):
    torch.manual_seed(0)
    model = _randomize_bn(nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                        nn.Conv2d(8, 4, 1, bias=True), nn.BatchNorm2d(4)))
    art = capture(model, "x:float32[batch,3,10,10]")
    x = torch.randn(5, 3, 10, 10)
    expected = model.eval()(x)
    outcome = run_pass("fold_batchnorm", art, tmp_path)
    assert sum(ops(outcome.artifact.obj)[b] for b in BN) == 0
    assert max_abs(expected.detach().numpy(), outcome.artifact.obj.module()(x).detach().numpy()) < 1e-5


def test_unfoldable_batchnorm_is_kept_with_reason(tmp_path):
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y  # the conv output has a second user

    art = capture(_randomize_bn(Shared()), "x:float32[batch,2,4,4]")
    outcome = run_pass("fold_batchnorm", art, tmp_path)
    assert not outcome.changed
    assert sum(ops(outcome.artifact.obj)[b] for b in BN) == 1
    assert any("other users" in n for n in outcome.notes)
