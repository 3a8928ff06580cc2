"""The Pass contract and the registry of passes by name (``PASSES``, a ``core.registry.Registry``).

A pass is a function of its input artifact and typed options. It declares what representation
it consumes and produces (a recipe is checked against both when it loads, and the pipeline again
when it runs). A recipe names passes; the registry resolves
the names. The registry is filled from above: importing ``infopt.passes`` registers every bundled
pass, so this floor imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

from infopt.core.errors import RecipeError
from infopt.core.registry import Registry

if TYPE_CHECKING:
    from infopt.core.artifact import Artifact
    from infopt.core.section import Section
    from infopt.core.target import Target


class PassOptions(BaseModel):
    """Base of every pass's options: typed fields, each with a default and a description."""

    model_config = ConfigDict(extra="forbid")

    SETTINGS: ClassVar[dict[str, str]] = {}
    """option field -> the build setting (a ``BuildConfig`` field) that sets it where the user gave that setting (a
    setting given wins over the recipe's option): how a command line flag reaches a pass without the builder naming
    it. An option declared with :func:`new_setting` names a setting of its own, which ``BuildConfig`` then has"""


def new_setting(default: Any, description: str, flag: str | None = None, **kwargs: Any) -> Any:
    """An option field that is also a build setting of its own, set by ``flag`` on ``infopt build``: how a plugin's
    pass adds a setting and its flag without a change to infopt. Name it in the options' ``SETTINGS``
    (``{"clip": "toy_clip"}``); ``BuildConfig`` gets a field ``toy_clip`` of the option's type, default and help in
    its ``plugins`` section, and ``infopt.build`` a keyword."""
    return Field(default, description=description, json_schema_extra={"new_setting": True, "flag": flag}, **kwargs)


def new_settings() -> dict[str, FieldInfo]:
    """The settings the registered passes declare with :func:`new_setting`, by setting name (the first pass that
    declares a name gives its field)."""
    found: dict[str, FieldInfo] = {}
    for each in PASSES.all().values():
        for option, name in each.options.SETTINGS.items():
            info = each.options.model_fields.get(option)
            if info is not None and isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("new_setting"):
                found.setdefault(name, info)
    return found


Settings = Mapping[str, Any]
"""the build settings the user gave, by name (``infopt.BuildConfig``'s field names): a pass's options take those
their ``SETTINGS`` name. A setting not given is absent, and the recipe's option stands."""


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
    choice: Any = None
    """text held out of calibration with the source model's figures on it and the budget
    (``quantize.layer_choice.ChoiceText``), for a pass choosing its layers' precision by accuracy"""
    settings: Settings = field(default_factory=dict)
    """what the build was asked for (the flags); the pipeline has put those a pass takes in its options already"""

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)

    def in_work_folder(self, path: Path) -> bool:
        """Whether ``path`` is a file of this build's work folder (an earlier pass's output), which a text-generation
        build's passes may move rather than copy: it runs one candidate, and no pass reads a work file after the
        next one."""
        return Path(path).resolve().is_relative_to(self.workdir.resolve())


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

    def notes(self) -> list[str]:
        """What the build says about the pass's outcome (INT8's mode and a missed budget, a TensorRT engine left to
        the server): the manifest's, report's and CLI's notes."""
        return []

    def sections(self) -> list["Section"]:
        """The pass's own report sections (the INT8 pass's layer and variant tables); the report places and renders
        them and names no pass."""
        return []

    def shipped_precision(self) -> str | None:
        """The precision the shipped artifact computes in when the pass left it in another than the recipe's (the
        INT8 pass shipping FP32 that measured faster); None otherwise."""
        return None

    def server_engine(self) -> dict[str, Any] | None:
        """What the pass asks the server to build at load time (a TensorRT engine left to Triton's ONNX Runtime
        backend: ``precision_mode`` and ``workspace_bytes``), or None; the emitters write it into the server's
        config."""
        return None


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
    needs_python_module: str | None = None
    """Why the pass needs the model's Python layers, when it does (INT4 quantizes layer by layer): a recipe with
    it is not built from a source without them (TorchScript, ``.pt2``, ONNX) unless a step of the recipe stands in
    for it, and the build says this text."""
    stands_in_for: tuple[str, ...] = ()
    """Passes whose work this one does where they cannot run (INT4 on the ONNX graph, for a source without a
    Python module, in place of ``quantize_int4``)."""

    def typed(self, record) -> Any:
        """A record's details as this pass's type (None when it ran skipped or recorded none)."""
        if record.skipped or not record.details:
            return None
        return self.details.of(record.details) if self.details is not None else record.details

    def preflight(self, raw: dict[str, Any] | None, target: "Target", has_calibration: bool,
                  settings: Settings | None = None) -> None:
        """Parse the step's options and run the pass's own check, if it has one."""
        options = self.parse_options(raw, settings)
        if self.check is not None:
            self.check(options, target, has_calibration)

    def parse_options(self, raw: dict[str, Any] | None, settings: Settings | None = None) -> PassOptions:
        """The step's options, with the build settings the user gave in the fields that take them."""
        values = dict(raw or {})
        if settings is not None:
            values.update({option: settings[name] for option, name in self.options.SETTINGS.items() if name in settings})
        try:
            return self.options(**values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise RecipeError(
                f"bad options for pass {self.name}: {problems}",
                fix=f"see `infopt recipes --passes` for the options of {self.name}",
            ) from exc

    def describe_options(self) -> list[dict[str, Any]]:
        """Each option: its name, type, default, description, and the build setting that sets it (or None)."""
        return [
            {"name": name, "type": getattr(f.annotation, "__name__", str(f.annotation)),
             "default": f.default, "description": f.description or "",
             "build_setting": self.options.SETTINGS.get(name)}
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
