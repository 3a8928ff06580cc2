"""``BuildConfig``: everything a build is asked for, as one typed object in sections.

``infopt.build(model, config=BuildConfig(...))`` and ``infopt.build(model, precision="int8", val="val.npz")`` are the
same call: each keyword names one field, in whichever section holds it, and is validated as that field. A keyword
that names no field is a :class:`UsageError` that lists the close ones. The command line maps its flags onto these
fields; a field's ``flag`` is the flag that sets it, named in the messages about it.

A field declares, beside its type and default:

- ``flag``: the command line's flag for it;
- ``logits_only``: only the logits graph takes it; a text-generation build refuses it, and a causal LM given it
  builds ``logits``;
- ``generation_only``: only a text-generation build takes it.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infopt.core.errors import UsageError


def setting(default: Any, description: str, flag: str | None = None, *, logits_only: bool = False,
            generation_only: bool = False, **kwargs: Any) -> Any:
    """A field of a section, with the flag that sets it and which task takes it."""
    extra = {"flag": flag, "logits_only": logits_only, "generation_only": generation_only}
    if callable(default):
        return Field(default_factory=default, description=description, json_schema_extra=extra, **kwargs)
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_assignment=True)


class DeploySection(Section):
    """Where the build runs and what it builds."""

    target: str = setting("cpu", "the target to build for (see `infopt targets`)", "--target")
    precision: str | None = setting(None, "fp32, fp16, bf16, fp8, int8 or int4; unset: fp32, or the recipe's own",
                                    "--precision")
    backend: str = setting("auto", "auto, onnxruntime, tensorrt or inductor", "--backend")
    task: str | None = setting(None, "text-generation or logits; unset: text-generation for a causal LM where it "
                                     "builds what was asked, else logits", "--task")
    recipe: str | Path | None = setting(None, "a recipe YAML file or a bundled recipe's name, instead of choosing "
                                              "by target and backend", "--recipe")
    pass_options: dict[str, dict[str, Any]] | None = setting(None, "options over the recipe's, by pass name")
    price_per_hour: float | None = setting(None, "USD per hour of the deployment machine, for the report's costs",
                                           "--price-per-hour")
    attention: str | None = setting(None, "a decoder's attention: fused or unfused", generation_only=True)


class SourceSection(Section):
    """How the model is read and what it takes."""

    inputs: Any = setting(None, 'the input spec: "name:dtype[dims]" strings or an InputSpec', "--input",
                          logits_only=True)
    dims: Any = setting(None, "dim ranges, NAME=MIN:OPT:MAX strings or a dict", "--dim", logits_only=True)
    model_class: str | None = setting(None, "module:Class of a state_dict's model", "--model-class", logits_only=True)
    model_args: str | dict | None = setting(None, "the model class's keyword arguments (JSON or a dict)",
                                            "--model-args", logits_only=True)
    allow_pickle: bool = setting(False, "load a pickled module (runs its code)", "--allow-pickle", logits_only=True)
    tokenizer: str | Path | None = setting(None, "a Hugging Face tokenizer folder, for --calib and --val text",
                                           "--tokenizer", logits_only=True)


class ValidationSection(Section):
    """What the build is judged on, and what it must hold."""

    val: Any = setting(None, "validation samples or text (a path), or data", "--val")
    max_val_samples: int = setting(256, "validation samples used at most", logits_only=True)
    thresholds: dict[str, float] | None = setting(None, "drift and latency thresholds by name (max_abs, min_cosine, "
                                                        "min_top1, min_sqnr_db, max_p99_ms)", logits_only=True)
    max_drift: str | None = setting(None, "the drift budget METRIC=VALUE that the INT8 fallback holds", "--max-drift")
    strict: bool = setting(False, "stop when any candidate fails, even if others passed", "--strict",
                           logits_only=True)
    allow_partial: bool = setting(True, "ship the best candidate that passed when others failed", logits_only=True)
    require_precision: bool = setting(False, "ship the precision asked for even when another measured faster",
                                      "--require-precision", logits_only=True)


class TimingSection(Section):
    """Which batch sizes are timed, and how they are weighed."""

    batch_sizes: list[int] | None = setting(None, "the batch sizes the model serves, timed", "--batch-sizes",
                                            logits_only=True)
    batch_mix: Any = setting(None, "each served batch size's share of requests, {1: 0.7, 32: 0.3}", "--batch-mix",
                             logits_only=True)


class CalibrationSection(Section):
    """The data quantization calibrates on, and how INT8 turns ranges into scales."""

    calibration: Any = setting(None, "calibration data: a path, an iterable or DataLoader, or module:function",
                               "--calib")
    calib_samples: int | None = setting(128, "calibration samples to draw (seeded)", "--calib-samples",
                                        logits_only=True)
    calib_seed: int = setting(0, "the seed of the calibration draw", logits_only=True)
    calib_method: str | None = setting(None, "how INT8 calibration turns ranges into scales", "--calib-method",
                                       logits_only=True)
    calib_percentile: float | None = setting(None, "the percentile method's percentile", "--calib-percentile",
                                             logits_only=True)
    calib_bins: int | None = setting(None, "histogram bins of calibration", "--calib-bins", logits_only=True)
    smoothquant_alpha: float | None = setting(None, "SmoothQuant's migration strength, 0..1", "--smoothquant-alpha",
                                              logits_only=True)


class Int4Section(Section):
    """INT4 weight-only quantization."""

    int4_method: str | None = setting(None, "auto, rtn, gptq, awq or awq-gptq", "--int4-method")
    group_size: int | None = setting(None, "input features per scale group", "--group-size")
    act_order: bool = setting(False, "GPTQ in order of activation size", "--act-order")
    int4_checkpoint: str | None = setting(None, "the 4-bit checkpoint's layout: auto, gptq, awq or none",
                                          "--int4-checkpoint", logits_only=True)
    max_bits_per_weight: float | None = setting(None, "the quantized layers' average stored bits per weight at most",
                                                "--max-bits-per-weight", generation_only=True)


class EmitSection(Section):
    """Where the output goes."""

    name: str | None = setting(None, "the model's name (default: the file's stem)", "--name")
    output: str | Path | None = setting(None, "the output folder (default: dist/<name>)", "--output")
    force: bool = setting(False, "replace an existing output folder", "--force")
    dry_run: bool = setting(False, "resolve what would be built and write nothing", "--dry-run")


class BuildConfig(BaseModel):
    """A build's settings, one section per concern. Build one with :meth:`of` from flat keywords."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deploy: DeploySection = Field(default_factory=DeploySection)
    source: SourceSection = Field(default_factory=SourceSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    timing: TimingSection = Field(default_factory=TimingSection)
    calib: CalibrationSection = Field(default_factory=CalibrationSection)
    int4: Int4Section = Field(default_factory=Int4Section)
    emit: EmitSection = Field(default_factory=EmitSection)

    SECTIONS: ClassVar[tuple[str, ...]] = ("deploy", "source", "validation", "timing", "calib", "int4", "emit")

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
                sections[section] = type(current)(**{**values, **given})
            except ValidationError as exc:
                error = exc.errors()[0]
                key = str(error["loc"][0]) if error["loc"] else section
                raise UsageError(f"build setting {key}={given.get(key)!r}: {error['msg']}",
                                 fix=f"{key} is {field_info(key).description}") from None
        return cls(**sections)

    def flat(self) -> dict[str, Any]:
        """Every field's value, by its name."""
        return {key: getattr(getattr(self, section), key) for key, section in section_of_field().items()}

    def given(self) -> dict[str, Any]:
        """The fields whose value is not their default, by name."""
        defaults = _defaults()
        return {key: value for key, value in self.flat().items() if not _same(value, defaults[key])}

    def logits_only_given(self) -> list[str]:
        """The fields given (not at their default) that only the logits graph takes."""
        return [key for key in self.given() if _extra(key)["logits_only"]]

    def generation_only_given(self) -> list[str]:
        """The fields given that only a text-generation build takes."""
        return [key for key in self.given() if _extra(key)["generation_only"]]


@lru_cache(maxsize=1)
def section_of_field() -> dict[str, str]:
    """Each field's section, by field name (every name is in one section only)."""
    owners: dict[str, str] = {}
    for section in BuildConfig.SECTIONS:
        for key in BuildConfig.model_fields[section].annotation.model_fields:
            assert key not in owners, f"build setting {key} is in two sections"
            owners[key] = section
    return owners


def field_info(key: str):
    """The pydantic field of the setting ``key``."""
    return BuildConfig.model_fields[section_of_field()[key]].annotation.model_fields[key]


def flag_of(key: str) -> str:
    """How a message names the setting ``key``: its flag, else the keyword."""
    return _extra(key)["flag"] or f"{key}="


def _extra(key: str) -> dict[str, Any]:
    return field_info(key).json_schema_extra or {}


@lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    return BuildConfig().flat()


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 - data (a DataLoader, an array) given where the default is None
        return False
