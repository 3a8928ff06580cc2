"""``BuildConfig``: the one typed object a build is configured by. ``infopt.build``'s keywords are its fields, each
validated as that field; the command line's flags map onto the same fields."""

from pathlib import Path

import pytest
import torch

import infopt
from infopt.api.build_config import BuildConfig, field_info, flag_of, section_of_field
from infopt.cli.reference import commands
from infopt.core.errors import UsageError


def test_a_keyword_sets_its_field_in_its_section_and_is_validated_as_it():
    config = BuildConfig.of(precision="int8", group_size="64", output="dist/m", val="val.npz")
    assert config.deploy.precision == "int8" and config.int4.group_size == 64 and config.emit.output == "dist/m"
    assert config.given() == {"precision": "int8", "group_size": 64, "output": "dist/m", "val": "val.npz"}
    again = BuildConfig.of(config, group_size=32)  # over a config: the rest stays
    assert again.int4.group_size == 32 and again.deploy.precision == "int8" and config.int4.group_size == 64
    assert BuildConfig.model_validate_json(again.model_dump_json()) == again  # a recipe can hold it as JSON


def test_each_quantization_methods_settings_are_its_own_section_defined_beside_it():
    from pydantic import ValidationError

    from infopt.quantize.int4_config import Int4Section
    from infopt.quantize.int8_settings import Int8Section

    config = BuildConfig.of(calib_method="entropy", smoothquant_alpha=0.5, group_size=64, calibration="calib.npz")
    assert config.int8 == Int8Section(calib_method="entropy", smoothquant_alpha=0.5)
    assert config.int4 == Int4Section(group_size=64) and config.calib.calibration == "calib.npz"
    assert BuildConfig(int8={"calib_method": "entropy", "smoothquant_alpha": 0.5},
                       int4={"group_size": 64}, calib={"calibration": "calib.npz"}) == config
    with pytest.raises(ValidationError, match="group_size"):  # INT4's setting is not INT8's
        BuildConfig(int8={"group_size": 64})


@pytest.mark.parametrize("settings, message, fix", [
    ({"precison": "int8"}, "unknown build setting 'precison'", "did you mean precision"),
    ({"group_size": "big"}, "build setting group_size='big'", "--group-size: INT4: input features per scale group"),
    ({"act_order": "sometimes"}, "build setting act_order='sometimes'", "--act-order: INT4 GPTQ"),
])
def test_a_wrong_setting_is_a_usage_error_naming_it_and_what_it_takes(settings, message, fix):
    with pytest.raises(UsageError, match=message) as refused:
        BuildConfig.of(**settings)
    assert fix in refused.value.fix


def test_build_refuses_an_unknown_keyword_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="unknown build setting 'outptu'") as refused:
        infopt.build(torch.nn.Linear(4, 2), torch.randn(2, 4), outptu="dist/x")
    assert "did you mean output" in refused.value.fix
    assert list(tmp_path.iterdir()) == []


def test_a_config_object_and_keywords_plan_the_same_build(tmp_path):
    model, example = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval(), torch.randn(2, 4)
    config = infopt.BuildConfig.of(backend="onnxruntime", output=tmp_path / "out", dry_run=True)
    planned = infopt.build(model, example, config, progress=False)
    by_keywords = infopt.build(model, example, backend="onnxruntime", output=tmp_path / "out", dry_run=True,
                               progress=False)
    assert planned == by_keywords
    assert planned["output"] == str(tmp_path / "out") and {c["backend"] for c in planned["candidates"]} == {"onnxruntime"}
    assert not (tmp_path / "out").exists()


def test_a_generation_setting_on_a_logits_build_is_refused():
    with pytest.raises(UsageError, match="--max-bits-per-weight only a text-generation build takes"):
        infopt.build(torch.nn.Linear(4, 2), torch.randn(2, 4), max_bits_per_weight=5.0, progress=False)


def test_every_setting_has_one_section_a_description_and_a_real_flag():
    owners = section_of_field()
    assert len(owners) >= 35 and {"precision", "val", "calibration", "output", "group_size"} <= set(owners)
    build = next(command for path, command, _ in commands() if path == "infopt build")
    flags = {opt for param in build.params for opt in getattr(param, "opts", [])}
    for key in owners:
        assert field_info(key).description, key
        flag = flag_of(key)
        assert flag == f"{key}=" or flag in flags, f"{key}'s flag {flag} is not an option of infopt build"


def test_the_python_api_takes_at_most_12_parameters_per_public_function():
    import ast

    root = Path(infopt.__file__).parent / "api"
    wide = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                count = len(node.args.posonlyargs) + len(node.args.args) + len(node.args.kwonlyargs)
                if count > 12:
                    wide.append(f"{path.name}:{node.lineno} {node.name} takes {count}")
    assert not wide, "\n".join(wide)


def test_every_setting_a_pass_takes_is_a_field_of_the_config():
    """A pass names the settings it takes (``PassOptions.SETTINGS``) by field name: a misspelt one would never be
    set."""
    import infopt.passes  # noqa: F401 - registers the bundled passes
    from infopt.core.pass_api import PASSES

    taken = {(p.name, name) for p in PASSES.all().values() for name in p.options.SETTINGS.values()}
    assert ("quantize_int4", "group_size") in taken and ("quantize_int8", "batch_sizes") in taken
    assert sorted((p, n) for p, n in taken if n not in section_of_field()) == []


def test_a_setting_reaches_every_pass_that_names_it_without_the_builders_naming_it(monkeypatch):
    """The settings handed to the passes are the given fields some registered pass reads: a new pass that reads a
    field gets it, with no list in the builders to extend. None, False and empty values are not given."""
    from typing import ClassVar

    import infopt.passes  # noqa: F401 - registers the bundled passes
    from infopt.core.pass_api import PASSES, Pass, PassOptions

    config = BuildConfig.of(price_per_hour=2.5, calib_bins=64, group_size=64, act_order=False, batch_sizes=[1, 8])
    assert config.pass_settings() == {"calib_bins": 64, "group_size": 64, "batch_sizes": [1, 8]}
    assert config.pass_settings(batch_sizes=[], batch_mix={1: 1.0})["batch_mix"] == {1: 1.0}
    assert "batch_sizes" not in config.pass_settings(batch_sizes=[])

    class PricedOptions(PassOptions):
        SETTINGS: ClassVar[dict[str, str]] = {"price": "price_per_hour"}
        price: float = 0.0

    monkeypatch.setattr(PASSES, "items", dict(PASSES.items))
    PASSES.register(Pass(name="priced", consumes="onnx", produces="onnx", run=lambda a, o, c: None,
                         options=PricedOptions))
    assert config.pass_settings()["price_per_hour"] == 2.5
    assert PASSES.named("priced").parse_options({}, config.pass_settings()).price == 2.5


def test_a_pass_declares_a_setting_of_its_own_with_its_flag_and_the_config_and_cli_take_it(monkeypatch):
    """A plugin's pass adds a setting with ``new_setting``: the config gets a field in its ``plugins`` section (the
    option's type, default and help), the setting reaches the pass, a bad value is refused by its flag, and
    ``infopt build`` gets the option. Before the pass registers, the keyword is unknown."""
    from typing import ClassVar

    import infopt.passes  # noqa: F401 - registers the bundled passes
    from infopt.cli import build as cli_build
    from infopt.core.pass_api import PASSES, Pass, PassOptions, new_setting

    with pytest.raises(UsageError, match="unknown build setting 'toy_clip'"):
        BuildConfig.of(toy_clip=0.5)
    before = BuildConfig.of(precision="int8")

    class ClipOptions(PassOptions):
        SETTINGS: ClassVar[dict[str, str]] = {"clip": "toy_clip"}
        clip: float = new_setting(8.0, "Clip each weight to +/- this before INT8.", "--toy-clip", gt=0)

    monkeypatch.setattr(PASSES, "items", dict(PASSES.items))
    PASSES.register(Pass(name="toy_clip_weights", consumes="onnx", produces="onnx", run=lambda a, o, c: None,
                         options=ClipOptions))
    assert section_of_field()["toy_clip"] == "plugins" and flag_of("toy_clip") == "--toy-clip"
    assert before.flat()["toy_clip"] == 8.0 and before.given() == {"precision": "int8"}  # made before: the default
    config = BuildConfig.of(before, toy_clip=0.5)
    assert config.given() == {"precision": "int8", "toy_clip": 0.5} and config.plugins.toy_clip == 0.5
    assert config.pass_settings() == {"toy_clip": 0.5}
    assert PASSES.named("toy_clip_weights").parse_options({}, config.pass_settings()).clip == 0.5
    assert BuildConfig.model_validate(config.model_dump()).given() == config.given()  # a recipe's round trip
    with pytest.raises(UsageError, match="toy_clip=-1.*greater than 0") as refused:
        BuildConfig.of(toy_clip=-1)
    assert refused.value.fix.startswith("--toy-clip: Clip each weight")
    option = next(p for p in cli_build._signature().parameters.values() if p.name == "toy_clip")
    typed = option.annotation.__metadata__[0]  # typer's OptionInfo: the first flag stands in its default
    assert option.default == 8.0 and "--toy-clip" in (typed.default, *typed.param_decls)
    assert "toy_clip" not in BuildConfig.of(precision="int8").pass_settings()  # not given: the recipe's option
