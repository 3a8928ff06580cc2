from __future__ import annotations

import json

import pytest

from infopt.core.errors import RecipeError
from infopt.core.pass_api import get_pass, passes
from infopt.core.recipe import Recipe, bundled_recipes, find_recipe, load_recipe
from infopt.core.target import get_target, targets


def test_required_targets_declared():
    found = targets()
    for name in ("cpu", "h100", "h200", "a100", "l4", "t4"):
        assert name in found
    h100 = found["h100"]
    assert h100.device == "cuda" and "fp8" in h100.precisions and h100.memory_bandwidth_gbs > 1000
    assert "bf16" not in found["t4"].precisions  # Turing has no bf16


def test_unknown_target_lists_known():
    with pytest.raises(RecipeError, match="h100"):
        get_target("h1000")


def test_precision_the_target_cannot_run():
    with pytest.raises(RecipeError, match="does not run fp8"):
        find_recipe(get_target("a100"), "fp8")


def test_missing_recipe_says_what_exists():
    with pytest.raises(RecipeError, match=r"builds: fp32 \(onnxruntime, inductor\); bf16 \(inductor\); "
                                          r"fp8 \(onnxruntime\); int8 \(onnxruntime\); int4 \(onnxruntime, inductor\)"):
        find_recipe(get_target("cpu"), "int8", "inductor")


def test_every_target_builds_each_precision_it_runs():
    """Each target has a recipe for every precision it lists."""
    from infopt.core.recipe import recipes_for
    from infopt.core.target import targets

    for target in targets().values():
        for precision in target.precisions:
            found = recipes_for(target, precision)
            assert found and all(r.precision == precision and r.backend in target.backends for r in found)
            assert [r.backend for r in found] == sorted((r.backend for r in found), key=target.backends.index)


def test_auto_lists_variants_after_their_base_recipe():
    from infopt.core.recipe import recipes_for

    assert [r.name for r in recipes_for(get_target("cpu"), "fp32")] == ["fp32-onnxruntime", "fp32-onnxruntime-fused",
                                                                         "fp32-inductor"]
    assert [r.name for r in recipes_for(get_target("h100"), "int8", "tensorrt")] == ["int8-tensorrt"]


def test_recipe_round_trips_through_json():
    recipe = load_recipe(bundled_recipes()["fp32-onnxruntime"])
    text = json.dumps(recipe.to_json())
    again = Recipe.from_json(text)
    assert again == recipe
    assert [s.name for s in again.passes][0] == "capture"


def test_bad_pass_options_are_rejected():
    data = load_recipe(bundled_recipes()["fp32-onnxruntime"]).to_json()
    data["passes"][3]["options"] = {"opset": 3}
    with pytest.raises(RecipeError, match="onnx_export"):
        Recipe.from_json(data)
    data["passes"][3]["options"] = {"no_such_option": 1}
    with pytest.raises(RecipeError, match="no_such_option"):
        Recipe.from_json(data)


def test_pass_chain_must_connect():
    data = load_recipe(bundled_recipes()["fp32-onnxruntime"]).to_json()
    data["passes"] = [{"name": "ort_optimize"}, {"name": "fold_batchnorm"}]
    with pytest.raises(RecipeError, match="consumes exported"):
        Recipe.from_json(data)


def test_registry_entries_carry_metadata():
    registry = passes()
    assert {"capture", "remove_noops", "fold_batchnorm", "onnx_export", "ort_optimize"} <= set(registry)
    export = get_pass("onnx_export")
    assert (export.consumes, export.produces) == ("exported", "onnx")
    opts = {o["name"]: o for o in export.describe_options()}
    assert opts["opset"]["default"] == 20 and opts["opset"]["description"]
    with pytest.raises(RecipeError, match="unknown pass"):
        get_pass("nope")


def test_recipe_by_bundled_name():
    assert load_recipe("fp32-inductor").backend == "inductor"
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_recipe("fp32-nowhere")
