"""The Pass contract and the registry of passes by name.

A pass is a function of its input artifact and typed options. It declares what representation
it consumes and produces (a recipe is checked against both when it loads, and the pipeline again
when it runs). A recipe names passes; the registry resolves
the names. The registry is filled from above: importing ``infopt.passes`` registers every bundled
pass, so this floor imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel, ConfigDict, ValidationError

from infopt.core.errors import RecipeError
from infopt.core.plugins import Registry

if TYPE_CHECKING:
    from infopt.core.artifact import Artifact
    from infopt.core.section import Section
    from infopt.core.target import Target


class PassOptions(BaseModel):
    """Base of every pass's options: typed fields, each with a default and a description."""

    model_config = ConfigDict(extra="forbid")


BUILD_SETTINGS = {
    "require_precision": "True when the build must ship the precision asked for (--require-precision)",
    "served_batch_sizes": "the batch sizes the model serves (--batch-sizes, or those of --batch-mix)",
    "batch_mix": "each served batch size's share of requests, keyed by the size as text (--batch-mix)",
}
"""What a build was asked for that a pass may take as one of its options. A field that declares
``json_schema_extra=from_build(NAME)`` is set to the build's NAME when the user gave it and the recipe did
not set the field, so the builder names no pass."""


def from_build(setting: str) -> dict[str, str]:
    """The marker that makes an option field take the build's ``setting`` (a key of :data:`BUILD_SETTINGS`)."""
    if setting not in BUILD_SETTINGS:
        raise ValueError(f"unknown build setting {setting!r}; one of: {', '.join(BUILD_SETTINGS)}")
    return {"build_setting": setting}


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
    check_source: str = "validation data"
    """what ``check_batches`` are, in words: the --val file, held-out calibration samples, or random inputs"""
    check_reference: Any = None
    """the source model's outputs on ``check_batches`` (per batch, per output), which the build's verdict compares
    the shipped model with: a pass that chooses by drift compares against them too, so that what it chose to meet
    the budget meets it when the build is judged"""

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


@dataclass
class PassOutcome:
    artifact: "Artifact"
    changed: bool
    notes: list[str] = field(default_factory=list)
    details: "dict[str, Any] | PassDetails" = field(default_factory=dict)
    """Structured results for the manifest and report (a pass's tables): the pass's ``details`` type
    where it declares one."""


class PassDetails(BaseModel):
    """Base of a pass's typed details. The pipeline stores them as JSON in the manifest; code that
    reads them back (the report, the builder) parses them with the same class, so a field renamed
    on one side fails in a test rather than reading as missing."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def of(cls, details: dict[str, Any] | None):
        """The typed form of a record's details; None when the pass recorded none (skipped, nothing to do)."""
        return cls.model_validate(details) if details else None


@dataclass(frozen=True)
class Pass:
    name: str
    consumes: str
    produces: str
    run: Callable[["Artifact", Any, PassContext], PassOutcome]
    options: type[PassOptions] = PassOptions
    description: str = ""
    details: type[PassDetails] | None = None
    """The type of the details the pass records, when code other than the report's generic listing reads them."""
    check: Callable[[Any, "Target", bool], None] | None = None
    """The pass's pre-flight: ``check(options, target, has_calibration)`` raises a UsageError, before any
    slow work, when the pass cannot run as asked (static INT8 without calibration data)."""
    sections: Callable[[Any], list["Section"]] | None = None
    """The pass's own report sections, given its typed ``details`` of one record (the INT8 pass's layer and
    variant tables); the report places and renders them and names no pass."""
    needs_python_module: str | None = None
    """Why the pass needs the model's Python layers, when it does (INT4 quantizes layer by layer): a recipe with
    it is not built from a source without them (TorchScript, ``.pt2``, ONNX) unless a step of the recipe stands in
    for it, and the build says this text."""
    stands_in_for: tuple[str, ...] = ()
    """Passes whose work this one does where they cannot run (INT4 on the ONNX graph, for a source without a
    Python module, in place of ``quantize_int4``)."""
    server_engine: Callable[[Any], dict[str, Any] | None] | None = None
    """What the pass asks the server to build at load time, given its typed ``details`` (a TensorRT engine left to
    Triton's ONNX Runtime backend: ``precision_mode`` and ``workspace_bytes``), or None; the emitters write it into
    the server's config."""
    notes: Callable[[Any], list[str]] | None = None
    """What the build says about the pass's outcome, given its typed ``details`` of one record (INT8's mode and a
    missed budget, a TensorRT engine left to the server): the manifest's, report's and CLI's notes."""
    shipped_precision: Callable[[Any], str | None] | None = None
    """The precision the shipped artifact computes in when the pass left it in another than the recipe's (the INT8
    pass shipping FP32 that measured faster), given its typed ``details``; None otherwise."""

    def typed(self, record) -> Any:
        """A record's details as this pass's type (None when it ran skipped or recorded none)."""
        if record.skipped or not record.details:
            return None
        return self.details.of(record.details) if self.details is not None else record.details

    def preflight(self, raw: dict[str, Any] | None, target: "Target", has_calibration: bool) -> None:
        """Parse the step's options and run the pass's own check, if it has one."""
        options = self.parse_options(raw)
        if self.check is not None:
            self.check(options, target, has_calibration)

    def parse_options(self, raw: dict[str, Any] | None) -> PassOptions:
        try:
            return self.options(**(raw or {}))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise RecipeError(
                f"bad options for pass {self.name}: {problems}",
                fix=f"see `infopt recipes --passes` for the options of {self.name}",
            ) from exc

    def build_settings(self) -> dict[str, str]:
        """Option field -> the build setting it takes (:func:`from_build`)."""
        return {name: f.json_schema_extra["build_setting"] for name, f in self.options.model_fields.items()
                if isinstance(f.json_schema_extra, dict) and "build_setting" in f.json_schema_extra}

    def describe_options(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "type": getattr(f.annotation, "__name__", str(f.annotation)),
             "default": f.default, "description": f.description or ""}
            for name, f in self.options.model_fields.items()
        ]


PASSES: Registry[Pass] = Registry("pass", lambda p: p.name)
register = PASSES.register
"""Add a pass to the registry; ``infopt.passes`` registers every bundled one when it is imported."""
passes = PASSES.all


def get_pass(name: str) -> Pass:
    if not PASSES.items:
        raise RecipeError(f"no passes are registered, so pass {name!r} cannot be resolved",
                          fix="import infopt.passes (infopt.api does) before loading a recipe")
    if name not in PASSES.items:
        raise RecipeError(f"unknown pass {name!r}", fix=f"use one of: {', '.join(PASSES.items)}")
    return PASSES.items[name]
