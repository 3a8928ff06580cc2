"""The command line's words turned into ``build``'s arguments, here so that the CLI only declares its
flags: precision flags to one precision, and the quantization flags to the build settings the passes take
(``core.pass_api.Settings``: a ``BuildConfig``'s fields that were given, by name, which each pass's
``PassOptions.SETTINGS`` declares), each value outside its choices named by its flag."""

from __future__ import annotations

from typing import get_args

from infopt.core.errors import UsageError
from infopt.quantize import calibrators
from infopt.quantize.method_names import CheckpointLayout, Int4MethodName

PRECISION_FLAGS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


def precision(flags: dict[str, bool], named: str | None = None) -> str:
    """The one precision among ``--fp32 … --int4`` (``flags``) and ``--precision`` (``named``); fp32 if none."""
    chosen = [p for p in PRECISION_FLAGS if flags.get(p)] + ([named] if named else [])
    if len(set(chosen)) > 1:
        raise UsageError(f"more than one precision given: {', '.join(chosen)}",
                         fix="pass one of --fp32/--fp16/--bf16/--fp8/--int8/--int4")
    return chosen[0] if chosen else "fp32"


def int4_settings(method, group_size, act_order, checkpoint) -> dict[str, object]:
    """The INT4 flags as build settings. (The group size is checked by the options that take it, for recipes
    as well.)"""
    for flag, value, allowed in (("--int4-method", method, ("auto", *get_args(Int4MethodName))),
                                 ("--int4-checkpoint", checkpoint, get_args(CheckpointLayout))):
        if value is not None and value not in allowed:
            raise UsageError(f"unknown {flag} {value!r}", fix=f"use one of: {', '.join(allowed)}")
    values = {"int4_method": method, "group_size": group_size, "act_order": act_order or None,
              "int4_checkpoint": checkpoint}
    return {k: v for k, v in values.items() if v is not None}


def calibration_settings(method, percentile, bins, alpha) -> dict[str, object]:
    """``--calib-method``, ``--calib-percentile``, ``--calib-bins`` and ``--smoothquant-alpha`` as build settings."""
    if method is not None and method not in calibrators.names():
        raise UsageError(f"unknown --calib-method {method!r}", fix=f"use one of: {', '.join(calibrators.names())}")
    values = {"calib_method": method, "calib_percentile": percentile, "calib_bins": bins, "smoothquant_alpha": alpha}
    return {k: v for k, v in values.items() if v is not None}


def given(**values: object) -> dict[str, object]:
    """The settings among ``values`` that were given: None, False and empty values were not."""
    return {k: v for k, v in values.items() if v is not None and v is not False and v != [] and v != {}}


def with_overrides(recipe, thresholds, batch_sizes, pass_options=None):
    """The recipe with the user's thresholds, served batch sizes and pass options."""
    if not thresholds and not batch_sizes and not pass_options:
        return recipe
    data = recipe.with_pass_options(pass_options).to_json()
    for key, value in (thresholds or {}).items():
        if key == "max_p99_ms":
            data["validation"]["latency"][key] = value
        elif key in data["validation"]["drift"]:
            data["validation"]["drift"][key] = value
        else:
            raise UsageError(f"unknown threshold {key!r}",
                             fix=f"use one of: {', '.join(list(data['validation']['drift']) + ['max_p99_ms'])}")
    if batch_sizes:
        data["validation"]["latency"]["batch_sizes"] = list(batch_sizes)
    return type(recipe).from_json(data)
