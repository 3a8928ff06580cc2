from __future__ import annotations

import numpy as np
import pytest
import torch

from infopt.core.errors import InputSpecError
from infopt.core.inputspec import DimRange, InputSpec, parse_dim, parse_tensor


def test_parse_input_and_dims():
    spec = InputSpec.parse(["x:float32[batch,3,224,224]", "mask:bool[batch,seq]"], ["batch=1:8:64", "seq=4:16:128"])
    assert spec.names == ("x", "mask")
    assert spec.inputs[0].shape == ("batch", 3, 224, 224)
    assert spec.dims["batch"] == DimRange(1, 8, 64)
    assert spec.dims["seq"] == DimRange(4, 16, 128)
    assert spec.batch_symbol == "batch"
    assert spec.concrete_shape(spec.inputs[1], "max") == (64, 128)


def test_default_range_for_undeclared_symbol():
    spec = InputSpec.parse(["x:fp16[n,4]"])
    assert spec.inputs[0].dtype == "float16"
    assert spec.dims["n"].min == 1 and spec.dims["n"].max >= spec.dims["n"].opt


@pytest.mark.parametrize("text", ["x:float32", "x:float33[1]", "x float32[1]", "x:float32[0,3]", "x:float32[a-b]", ""])
def test_malformed_input(text):
    with pytest.raises(InputSpecError):
        parse_tensor(text)


@pytest.mark.parametrize("text", ["batch=1:8", "batch=8:1:64", "batch=a:b:c", "=1:2:3"])
def test_malformed_dim(text):
    with pytest.raises(InputSpecError):
        parse_dim(text)


def test_dim_for_unknown_symbol():
    with pytest.raises(InputSpecError, match="no input uses"):
        InputSpec.parse(["x:float32[batch,3]"], ["seq=1:2:3"])


def test_from_examples_and_json_round_trip():
    spec = InputSpec.from_examples([torch.zeros(4, 3), np.zeros((4, 7), dtype=np.int64)], ["a", "b"])
    assert spec.inputs[0].shape == ("batch", 3) and spec.inputs[1].dtype == "int64"
    assert spec.dims["batch"].opt >= 4
    again = InputSpec.from_json(spec.to_json())
    assert again == spec
    assert str(again) == "a:float32[batch,3] b:int64[batch,7]"


def test_repeated_names_rejected():
    with pytest.raises(InputSpecError, match="repeat"):
        InputSpec.parse(["x:float32[1]", "x:float32[2]"])
