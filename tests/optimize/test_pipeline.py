from __future__ import annotations

import pytest
import torch

from infopt.artifact import Artifact
from infopt.errors import BuildError, CaptureError
from infopt.inputspec import InputSpec
from infopt.pipeline import Pipeline
from infopt.recipe import bundled_recipes, load_recipe
from infopt.target import get_target
from tests.bad_models import DataDependent


@pytest.fixture
def recipe():
    return load_recipe(bundled_recipes()["fp32-onnxruntime"])


def test_records_each_pass(recipe, digits, tmp_path):
    spec = InputSpec.parse(["x:float32[batch,1,8,8]"])
    final = Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("torch", spec, obj=digits[0], output_names=("logits",)))
    assert final.kind == "onnx" and final.path.is_file()
    assert [r.name for r in final.lineage] == [s.name for s in recipe.passes]
    assert all(r.seconds > 0 and r.size_bytes > 0 and not r.skipped for r in final.lineage)
    assert final.output_names == ("logits",)


def test_onnx_input_skips_torch_passes(recipe, digits, tmp_path):
    spec = InputSpec.parse(["x:float32[batch,1,8,8]"])
    exported = Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("torch", spec, obj=digits[0]))
    onnx_in = Artifact("onnx", spec, path=exported.path)
    (tmp_path / "b").mkdir()
    again = Pipeline(recipe, get_target("cpu"), tmp_path / "b").run(onnx_in)
    assert [r.skipped for r in again.lineage] == [True, True, True, True, False]
    assert "already onnx" in again.lineage[0].notes[0]


def test_capture_error_names_the_pass(recipe, tmp_path):
    spec = InputSpec.parse(["x:float32[batch,4]"])
    with pytest.raises(CaptureError) as err:
        Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("torch", spec, obj=DataDependent().eval()))
    assert "pass capture" in str(err.value)


def test_unexpected_failure_becomes_build_error_naming_pass(recipe, tmp_path):
    spec = InputSpec.parse(["x:float32[batch,4]"])
    program = torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(2, 4),))
    broken = Artifact("exported", spec, obj=program)
    program.graph_signature.input_specs.clear()  # a program no exporter can read
    with pytest.raises(BuildError) as err:
        Pipeline(recipe, get_target("cpu"), tmp_path).run(broken)
    assert err.value.exit_code == 3
    assert "pass onnx_export failed" in str(err.value) and "\x1b[" not in str(err.value)
