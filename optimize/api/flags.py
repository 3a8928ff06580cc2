"""The command line's words turned into ``build``'s arguments, here so that the CLI only declares its
flags: precision flags to one precision, and each quantization setting outside its choices named by its flag."""

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


def check_choices(config) -> None:
    """A usage error, named by its flag, for a quantization setting of ``config`` (a ``BuildConfig``) outside its
    choices: the INT4 method and checkpoint layout, and the INT8 calibration method (a plugin's too). The group size
    is checked by the options that take it, for recipes as well."""
    int4, int8 = config.int4, config.int8
    for flag, value, allowed in (("--int4-method", int4.int4_method, ("auto", *get_args(Int4MethodName))),
                                 ("--int4-checkpoint", int4.int4_checkpoint, get_args(CheckpointLayout)),
                                 ("--calib-method", int8.calib_method, tuple(calibrators.names()))):
        if value is not None and value not in allowed:
            raise UsageError(f"unknown {flag} {value!r}", fix=f"use one of: {', '.join(allowed)}")


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
