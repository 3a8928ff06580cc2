from __future__ import annotations

import pytest
import torch

from infopt.core.artifact import Artifact
from infopt.core.errors import BuildError, CaptureError, DiskFull
from infopt.core.inputspec import InputSpec
from infopt.core.pipeline import Pipeline
from infopt.core.recipe import bundled_recipes, load_recipe
from infopt.core.target import get_target
from tests.support.bad_models import DataDependent


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
    assert [r.skipped for r in again.lineage] == [True, True, True, True, False, False]  # mask fill and ort_optimize run
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


def test_candidates_share_the_passes_their_recipes_begin_with(digits, tmp_path):
    """fp32-onnxruntime-fused starts from fp32-onnxruntime's ONNX export, fp32-inductor from its folded
    program; each gets its own copy, so the passes that follow (which edit in place) change no other's."""
    from infopt.core.pipeline import SharedPrefixes, step_keys

    recipes = [load_recipe(bundled_recipes()[name]) for name in ("fp32-onnxruntime", "fp32-onnxruntime-fused",
                                                                  "fp32-inductor")]
    spec = InputSpec.parse(["x:float32[batch,1,8,8]"])
    shared = SharedPrefixes(recipes)
    source = Artifact("torch", spec, obj=digits[0], output_names=("logits",))
    for r in recipes:
        (tmp_path / r.name).mkdir()
    plain, fused = [Pipeline(r, get_target("cpu"), tmp_path / r.name).run(source, shared) for r in recipes[:2]]
    assert [r.name for r in fused.lineage] == [s.name for s in recipes[1].passes]
    assert fused.path.parent.name == "fp32-onnxruntime-fused"  # the fusion wrote its own file
    for record in fused.lineage[:4]:  # capture ... onnx_export
        assert "reused from fp32-onnxruntime's build" in " ".join(record.notes), record
    assert not any("reused" in note for record in plain.lineage + fused.lineage[4:] for note in record.notes)
    # the inductor recipe shares capture, remove_noops and fold_batchnorm, not onnx_export
    start, program = shared.start(step_keys(recipes[2]), source)
    again = shared.start(step_keys(recipes[2]), source)[1]
    assert start == 3 and program.kind == "exported" and len(program.lineage) == 3
    assert again.obj is not program.obj  # each start has its own copy of the program
    inputs = torch.from_numpy(digits[1]["val"][0][:4])
    with torch.inference_mode():
        assert torch.allclose(program.obj.module()(inputs), digits[0](inputs), atol=1e-5)


def test_details_are_checked_against_the_type_the_pass_declares(tmp_path, monkeypatch):
    """A pass's typed details reach the lineage as JSON; details that do not fit the type are a build error."""
    from pydantic import Field

    from infopt.core.pass_api import PASSES, Pass, PassDetails, PassOutcome
    from infopt.core.recipe import Recipe

    class CountDetails(PassDetails):
        count: int
        names: list[str] = Field(default_factory=list)

    recorded = {"value": CountDetails(count=2, names=["a", "b"])}

    def run(artifact, options, context):
        return PassOutcome(artifact, True, [], recorded["value"])

    monkeypatch.setitem(PASSES.items, "count_things", Pass("count_things", "onnx", "onnx", run, details=CountDetails))
    recipe = Recipe(name="count", precision="fp32", backend="onnxruntime", passes=[{"name": "count_things"}])
    spec = InputSpec.parse(["x:float32[batch,4]"])
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    final = Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("onnx", spec, path=model))
    assert final.lineage[-1].details == {"count": 2, "names": ["a", "b"]}
    assert CountDetails.of(final.lineage[-1].details).names == ["a", "b"]
    recorded["value"] = {"count": "many"}
    with pytest.raises(BuildError, match="count_things recorded details that do not fit CountDetails"):
        Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("onnx", spec, path=model))
    monkeypatch.setitem(PASSES.items, "count_things", Pass("count_things", "onnx", "onnx", run))
    recorded["value"] = {"count": 2}
    with pytest.raises(BuildError, match="count_things recorded details but declares no type"):
        Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("onnx", spec, path=model))


def test_a_full_disk_says_which_disk_and_how_much_is_free(recipe, digits, tmp_path, monkeypatch):
    """A pass that fills the disk (as onnx's writer says it, without an errno) is an environment problem naming
    the work folder's disk and its free space, not a build error asking for --verbose."""
    import dataclasses
    import errno

    from infopt.core.pass_api import PASSES

    def full(*_):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise ValueError("Not enough free space to write the tensors") from exc

    monkeypatch.setitem(PASSES.items, "ort_optimize", dataclasses.replace(PASSES.items["ort_optimize"], run=full))
    spec = InputSpec.parse(["x:float32[batch,1,8,8]"])
    with pytest.raises(DiskFull) as err:
        Pipeline(recipe, get_target("cpu"), tmp_path).run(Artifact("torch", spec, obj=digits[0]))
    assert err.value.exit_code == 4 and "pass ort_optimize ran out of disk space" in err.value.what
    assert str(tmp_path) in err.value.what and " GB free" in err.value.what and "TMPDIR" in err.value.fix
    assert "--verbose" not in str(err.value)
