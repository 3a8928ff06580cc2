"""The ends of the dim ranges: where a built model that takes the samples' sizes fails."""

from __future__ import annotations

import pytest
import torch

from infopt.core.inputspec import InputSpec
from infopt.runtime.backends.onnxruntime import OrtRunner
from infopt.runtime.runner import TorchRunner
from infopt.validators.range_ends import RangeFailure, check_range_ends, range_ends


def test_built_model_that_refuses_an_end_of_its_range(digits, tmp_path):
    """An ONNX model fixed at batch 1 stands for a build that takes the samples' sizes but not the
    declared range: the range check names the dims it fails at."""
    model = digits[0].eval()
    torch.onnx.export(model, (torch.randn(1, 1, 8, 8),), str(tmp_path / "fixed.onnx"), input_names=["x"],
                      output_names=["logits"], dynamo=False)
    spec = InputSpec.parse(["x:float32[batch,1,8,8]"], ["batch=1:2:4"])
    ends = range_ends(spec, TorchRunner(model, ["x"], ["logits"]), model)
    assert [where for where, _, _ in ends] == ["batch=1", "batch=4"]
    with pytest.raises(RangeFailure, match="fails to run at batch=4"):
        check_range_ends(OrtRunner(tmp_path / "fixed.onnx"), ends)
