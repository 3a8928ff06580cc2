from __future__ import annotations

import json

import pytest

from infopt.errors import RecipeError
from infopt.recipe import Recipe, bundled_recipes, find_recipe, load_recipe
from infopt.registry import get_pass, passes
from infopt.target import get_target, targets


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
    with pytest.raises(RecipeError, match="fp32-onnxruntime"):
        find_recipe(get_target("cpu"), "int4")


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
