"""The command line's words turned into ``build``'s arguments, here so that the CLI only declares its
flags: precision flags to one precision, and the quantization flags to pass options, each value
outside its choices named by its flag."""

from __future__ import annotations

from typing import get_args

from infopt.core.errors import UsageError
from infopt.passes.fx.quantize_int4 import QuantizeInt4Options
from infopt.quantize import calibrators

PRECISION_FLAGS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


def precision(flags: dict[str, bool], named: str | None = None) -> str:
    """The one precision among ``--fp32 … --int4`` (``flags``) and ``--precision`` (``named``); fp32 if none."""
    chosen = [p for p in PRECISION_FLAGS if flags.get(p)] + ([named] if named else [])
    if len(set(chosen)) > 1:
        raise UsageError(f"more than one precision given: {', '.join(chosen)}",
                         fix="pass one of --fp32/--fp16/--bf16/--fp8/--int8/--int4")
    return chosen[0] if chosen else "fp32"


def int4_options(method, group_size, act_order, checkpoint) -> dict[str, dict]:
    """The INT4 flags as ``quantize_int4`` options. (The group size is checked by the options
    themselves, for recipes as well.)"""
    fields = QuantizeInt4Options.model_fields
    for flag, value, field in (("--int4-method", method, "method"), ("--int4-checkpoint", checkpoint, "checkpoint")):
        allowed = get_args(fields[field].annotation)
        if value is not None and value not in allowed:
            raise UsageError(f"unknown {flag} {value!r}", fix=f"use one of: {', '.join(allowed)}")
    values = {"method": method, "group_size": group_size, "act_order": act_order or None, "checkpoint": checkpoint}
    found = {k: v for k, v in values.items() if v is not None}
    return {"quantize_int4": found} if found else {}


def calibration_options(method, percentile, bins, alpha) -> dict[str, dict]:
    """``--calib-method``, ``--calib-percentile``, ``--calib-bins`` and ``--smoothquant-alpha`` as pass options."""
    if method is not None and method not in calibrators.names():
        raise UsageError(f"unknown --calib-method {method!r}", fix=f"use one of: {', '.join(calibrators.names())}")
    int8 = {k: v for k, v in {"method": method, "percentile": percentile, "bins": bins}.items() if v is not None}
    found = {"quantize_int8": int8} if int8 else {}
    if alpha is not None:
        found["smoothquant"] = {"alpha": alpha}
    return found
