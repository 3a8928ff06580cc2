"""The Pass contract and the registry of passes by name.

A pass is a function of its input artifact and typed options. It declares what representation
it consumes and produces, whether it needs calibration data, and what it requires of its input
and ensures of its output. A recipe names passes; the registry resolves the names.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from infopt.core.errors import RecipeError

if TYPE_CHECKING:
    from infopt.core.artifact import Artifact
    from infopt.core.target import Target

PASS_MODULES: tuple[str, ...] = (
    "infopt.exporters.torch_export",
    "infopt.passes.fx.remove_noops",
    "infopt.passes.fx.fold_batchnorm",
    "infopt.passes.fx.cast_precision",
    "infopt.passes.fx.quantize_int4",
    "infopt.passes.fx.int4_kernels",
    "infopt.passes.lower.onnx_export",
    "infopt.passes.lower.aoti_compile",
    "infopt.passes.lower.tensorrt_build",
    "infopt.passes.onnx.ort_optimize",
    "infopt.passes.onnx.transformer_fusion",
    "infopt.passes.onnx.quantize_int4_graph",
    "infopt.passes.onnx.smoothquant",
    "infopt.passes.onnx.quantize_int8",
)
"""Modules that each define one ``PASS``; importing them is cheap (torch loads on first run)."""


class PassOptions(BaseModel):
    """Base of every pass's options: typed fields, each with a default and a description."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class PassContext:
    """What a pass may use besides its input: the target, a scratch folder, calibration data,
    the user's drift budget, batches to check drift on when there is no calibration data, and a
    callback that shows progress on long work."""

    target: "Target"
    workdir: Path
    calibration: Any = None
    budget: Any = None
    check_batches: Any = None
    progress: Callable[[str], None] | None = None

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


@dataclass
class PassOutcome:
    artifact: "Artifact"
    changed: bool
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    """Structured results for the manifest and report (a pass's tables)."""


@dataclass(frozen=True)
class Pass:
    name: str
    consumes: str
    produces: str
    run: Callable[["Artifact", Any, PassContext], PassOutcome]
    options: type[PassOptions] = PassOptions
    description: str = ""
    needs_calibration: bool = False
    mutates_input: bool = False
    skippable: bool = True
    """A pass whose input is already behind the model (capture, for an ONNX file) is skipped; one
    that is not skippable (a quantization that defines the precision) stops the build instead."""
    requires: tuple[str, ...] = ()
    ensures: tuple[str, ...] = ()

    def parse_options(self, raw: dict[str, Any] | None) -> PassOptions:
        try:
            return self.options(**(raw or {}))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise RecipeError(
                f"bad options for pass {self.name}: {problems}",
                fix=f"see `infopt recipes --passes` for the options of {self.name}",
            ) from exc

    def describe_options(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "type": getattr(f.annotation, "__name__", str(f.annotation)),
             "default": f.default, "description": f.description or ""}
            for name, f in self.options.model_fields.items()
        ]


@cache
def _registry() -> dict[str, Pass]:
    found: dict[str, Pass] = {}
    for module_name in PASS_MODULES:
        definition: Pass = importlib.import_module(module_name).PASS
        if definition.name in found:
            raise RuntimeError(f"pass {definition.name} is defined twice")
        found[definition.name] = definition
    return found


def passes() -> dict[str, Pass]:
    return dict(_registry())


def get_pass(name: str) -> Pass:
    known = _registry()
    if name not in known:
        raise RecipeError(f"unknown pass {name!r}", fix=f"use one of: {', '.join(known)}")
    return known[name]
