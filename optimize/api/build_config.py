"""``BuildConfig``: everything a build is asked for, as one typed object in sections.

``infopt.build(model, config=BuildConfig(...))`` and ``infopt.build(model, precision="int8", val="val.npz")`` are the
same call: each keyword names one field, in whichever section holds it, and is validated as that field. A keyword
that names no field is a :class:`UsageError` that lists the close ones. The command line maps its flags onto these
fields; a field's ``flag`` is the flag that sets it, named in the messages about it.

The sections are the build's own, here, and each quantization method's, beside the method in ``quantize/``
(``int8_settings.Int8Section``, ``int4_config.Int4Section``). A field is made with ``core.settings.setting`` and
declares, beside its type and default:

- ``flag``: the command line's flag for it;
- ``logits_only``: only the logits graph takes it; a text-generation build refuses it, and a causal LM given it
  builds ``logits``;
- ``generation_only``: only a text-generation build takes it.

A plugin's pass adds a setting of its own with ``core.pass_api.new_setting`` on one of its options: it becomes a
field of the ``plugins`` section, its flag an option of ``infopt build``, with no change here.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, create_model, field_validator

from infopt.core.errors import UsageError
from infopt.core.pass_api import PASSES, new_settings
from infopt.core.settings import Section, setting
from infopt.quantize.int4_config import Int4Section
from infopt.quantize.int8_settings import Int8Section

DEFAULT_MAX_VAL_SAMPLES = 256
"""the validation samples a logits build judges at most, by default"""


class DeploySection(Section):
    """Where the build runs and what it builds."""

    target: str = setting("cpu", "Target to build for (see `infopt targets`).", ("--target", "-t"))
    precision: str | None = setting(None, "fp32, fp16, bf16, fp8, int8 or int4 (default: fp32, or the recipe's own).",
                                    ("--precision", "-p"))
    backend: str = setting("auto", "auto, onnxruntime, tensorrt or inductor.", "--backend")
    task: str | None = setting(
        None, "text-generation: a causal LM's decoder with its KV cache, written as an ONNX Runtime GenAI folder and "
              "judged by generating from it (fp32, --int8, --int4; CPU), the default for a causal LM where it builds "
              "what was asked; logits: one graph from the inputs to the head's output, the default for every other "
              "model.", "--task")
    recipe: str | Path | None = setting(None, "A recipe YAML file, or a bundled recipe's name (see `infopt recipes`), "
                                              "instead of choosing by target and backend.", "--recipe")
    pass_options: dict[str, dict[str, Any]] | None = setting(None, "Options over the recipe's, by pass name.")
    price_per_hour: float | None = setting(
        None, "USD per hour of the machine you deploy on, for the report's cost per million predictions, or output "
              "tokens with --task text-generation (replaces the target's).", "--price-per-hour")
    attention: str | None = setting(None, "A decoder's attention: fused or unfused.", generation_only=True)
    float32_scales: bool = setting(
        False, "Text generation with --int8 or --int4: keep the quantized blocks' scales in float32 (default float16, "
               "as llama.cpp's blocks; the quantized ops then compute in float16, which an activation beyond 65,504 "
               "would overflow).", "--float32-scales", generation_only=True)


class SourceSection(Section):
    """How the model is read and what it takes."""

    inputs: Any = setting(None, 'The input spec: "name:dtype[dims]" strings, one per input, or an InputSpec.',
                          ("--input", "-i"), logits_only=True)
    dims: Any = setting(None, "Ranges of symbolic dims, name=min:opt:max strings or a dict.", "--dim",
                        logits_only=True)
    model_class: str | None = setting(None, "pkg.module:Class to load a state_dict into.", "--model-class",
                                      logits_only=True)
    model_args: str | dict | None = setting(None, "Keyword arguments for --model-class (a JSON object, or a dict).",
                                            "--model-args", logits_only=True)
    allow_pickle: bool = setting(False, "Allow unpickling a fully pickled nn.Module (runs code from the file).",
                                 "--allow-pickle", logits_only=True)
    tokenizer: str | Path | None = setting(None, "Hugging Face tokenizer folder, for a --calib text file (one example "
                                                 "per line).", "--tokenizer", logits_only=True)


class ValidationSection(Section):
    """What the build is judged on, and what it must hold."""

    val: Any = setting(None, "Validation samples (a folder or file of .npy/.npz/.pt, or a text file for a causal "
                             "LM), or the samples themselves.", "--val")
    max_val_samples: int = setting(DEFAULT_MAX_VAL_SAMPLES, "Validation samples used at most.", logits_only=True)
    thresholds: dict[str, float] | None = setting(None, "Drift and latency limits by name: max_abs, min_cosine, "
                                                        "min_top1, min_sqnr_db, max_p99_ms.", logits_only=True)
    max_drift: str | None = setting(
        None, "Drift budget METRIC=VALUE, e.g. cosine_mean=0.995 or top1=0.99; INT8's sensitive layers fall back to "
              "FP32 until it holds.", "--max-drift")
    strict: bool = setting(False, "Exit 3 when any candidate fails to build or run, even if others passed (default: "
                                  "ship the best that passed and warn).", "--strict", logits_only=True)
    allow_partial: bool = setting(True, "Ship the best candidate that passed when others failed.", logits_only=True)
    require_precision: bool = setting(False, "Ship the precision asked for even when a faster one was measured (INT8 "
                                             "on a CPU where FP32 is faster).", "--require-precision",
                                      logits_only=True)


class TimingSection(Section):
    """Which batch sizes are timed, and how they are weighed."""

    batch_sizes: list[int] | None = setting(None, "The batch sizes to time.", "--batch-sizes", logits_only=True)
    batch_mix: Any = setting(None, "The batch sizes the model serves and each one's share of requests, "
                                   "{1: 0.7, 32: 0.3}.", "--batch-mix", logits_only=True)


class CalibrationSection(Section):
    """The data quantization calibrates on."""

    calibration: Any = setting(None, "Calibration samples (.npy/.npz/.pt folder or file, or module:function), or a "
                                     "text file; makes INT8 static.", "--calib")
    calib_samples: int | None = setting(128, "Calibration samples to draw (seeded).", "--calib-samples",
                                        logits_only=True)
    calib_seed: int = setting(0, "The seed of the calibration draw.", logits_only=True)


class EmitSection(Section):
    """Where the output goes."""

    name: str | None = setting(None, "Model name (default: the file's stem).", "--name")
    output: str | Path | None = setting(None, "Output folder (default: dist/<name>).", ("--output", "-o"))
    force: bool = setting(False, "Replace an existing output folder.", "--force")
    dry_run: bool = setting(False, "Load the model and show what would be built (candidates, passes, inputs, output "
                                   "folder); write nothing.", "--dry-run")


_PLUGIN_SECTIONS: dict[tuple, type[Section]] = {}


def plugin_section() -> type[Section]:
    """The section of the settings the registered passes declare (``core.pass_api.new_setting``): a model of those
    fields, made again when a pass that declares one registers."""
    own = _own_fields()
    declared = {name: info for name, info in new_settings().items() if name not in own}
    key = tuple((name, id(info)) for name, info in declared.items())
    if key not in _PLUGIN_SECTIONS:
        fields = {name: (info.annotation, info) for name, info in declared.items()}
        _PLUGIN_SECTIONS[key] = create_model("PluginSection", __base__=Section,
                                             __doc__="Settings that plugins' passes declare.", **fields)
    return _PLUGIN_SECTIONS[key]


class BuildConfig(BaseModel):
    """A build's settings, one section per concern. Build one with :meth:`of` from flat keywords."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deploy: DeploySection = Field(default_factory=DeploySection)
    source: SourceSection = Field(default_factory=SourceSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    timing: TimingSection = Field(default_factory=TimingSection)
    calib: CalibrationSection = Field(default_factory=CalibrationSection)
    int8: Int8Section = Field(default_factory=Int8Section)
    int4: Int4Section = Field(default_factory=Int4Section)
    emit: EmitSection = Field(default_factory=EmitSection)
    plugins: SerializeAsAny[Section] = Field(default_factory=lambda: plugin_section()())

    SECTIONS: ClassVar[tuple[str, ...]] = ("deploy", "source", "validation", "timing", "calib", "int8", "int4", "emit",
                                           "plugins")

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugins(cls, value: Any) -> Any:
        return plugin_section()(**value) if isinstance(value, dict) else value

    @classmethod
    def of(cls, config: BuildConfig | None = None, **settings: Any) -> BuildConfig:
        """``config`` (or the defaults) with each keyword in ``settings`` set on the field of that name."""
        config = config if config is not None else cls()
        if not isinstance(config, cls):
            raise UsageError(f"config is a {type(config).__name__}, not a BuildConfig",
                             fix="pass config=infopt.BuildConfig(...), or the settings as keywords")
        owners = section_of_field()
        unknown = [key for key in settings if key not in owners]
        if unknown:
            close = difflib.get_close_matches(unknown[0], owners, n=3)
            raise UsageError(f"unknown build setting {unknown[0]!r}",
                             fix=f"did you mean {' or '.join(close)}?" if close else
                             f"use one of: {', '.join(sorted(owners))}")
        sections = {}
        for section in cls.SECTIONS:
            current = getattr(config, section)
            given = {key: value for key, value in settings.items() if owners[key] == section}
            if not given:
                sections[section] = current
                continue
            values = {key: getattr(current, key) for key in current.model_fields_set}
            try:
                sections[section] = _section_type(section)(**{**values, **given})
            except ValidationError as exc:
                error = exc.errors()[0]
                key = str(error["loc"][0]) if error["loc"] else section
                raise UsageError(f"build setting {key}={given.get(key)!r}: {error['msg']}",
                                 fix=f"{flag_of(key)}: {field_info(key).description}") from None
        return cls(**sections)

    def flat(self) -> dict[str, Any]:
        """Every field's value, by its name."""
        plugin_fields = plugin_section().model_fields  # one made before its pass registered lacks it: its default
        return {key: getattr(self.plugins, key, plugin_fields[key].default) if section == "plugins" else
                getattr(getattr(self, section), key) for key, section in section_of_field().items()}

    def given(self) -> dict[str, Any]:
        """The fields whose value is not their default, by name."""
        defaults = _defaults()
        return {key: value for key, value in self.flat().items() if not _same(value, defaults[key])}

    def pass_settings(self, **overrides: Any) -> dict[str, Any]:
        """The settings given that a registered pass reads (its options' ``SETTINGS``), by name, with ``overrides``
        over them: what the pipeline hands the passes. None, False and empty values are not given. No flow
        lists them, so a new setting is its field, the pass that reads it, and a test."""
        read = {name for each in PASSES.all().values() for name in each.options.SETTINGS.values()}
        values = {**{key: value for key, value in self.given().items() if key in read}, **overrides}
        return {key: value for key, value in values.items()
                if value is not None and value is not False and not (isinstance(value, (list, dict)) and not value)}

    def logits_only_given(self) -> list[str]:
        """The fields given (not at their default) that only the logits graph takes."""
        return [key for key in self.given() if _extra(key)["logits_only"]]

    def generation_only_given(self) -> list[str]:
        """The fields given that only a text-generation build takes."""
        return [key for key in self.given() if _extra(key)["generation_only"]]


def _section_type(section: str) -> type[Section]:
    return plugin_section() if section == "plugins" else BuildConfig.model_fields[section].annotation


@lru_cache(maxsize=1)
def _own_fields() -> dict[str, str]:
    """Each field of infopt's own sections, by name: its section."""
    owners: dict[str, str] = {}
    for section in BuildConfig.SECTIONS:
        if section == "plugins":
            continue
        for key in BuildConfig.model_fields[section].annotation.model_fields:
            assert key not in owners, f"build setting {key} is in two sections"
            owners[key] = section
    return owners


def section_of_field() -> dict[str, str]:
    """Each field's section, by field name (every name is in one section only): infopt's own, then those the
    registered passes declare."""
    return {**_own_fields(), **{key: "plugins" for key in plugin_section().model_fields}}


def field_info(key: str):
    """The pydantic field of the setting ``key``."""
    return _section_type(section_of_field()[key]).model_fields[key]


def flags_of(key: str) -> tuple[str, ...]:
    """The command line's flags for the setting ``key`` (none for a setting only the Python API takes)."""
    flag = _extra(key)["flag"]
    return (flag,) if isinstance(flag, str) else tuple(flag or ())


def flag_of(key: str) -> str:
    """How a message names the setting ``key``: its flag, else the keyword."""
    return next(iter(flags_of(key)), f"{key}=")


def _extra(key: str) -> dict[str, Any]:
    return {"flag": None, "logits_only": False, "generation_only": False, **(field_info(key).json_schema_extra or {})}


def _defaults() -> dict[str, Any]:
    return BuildConfig().flat()


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - data (a DataLoader, an array) given where the default is None
        return False
