"""Target: hardware infopt builds for, declared in ``recipes/targets.yaml``."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from infopt.core.errors import RecipeError
from infopt.core.yaml_files import load_yaml
from infopt.recipes import TARGETS_FILE

Precision = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
BackendName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*$")]
"""A backend's registered name (``runtime/backends/``); the registry, not this module, knows which exist."""


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    device: Literal["cpu", "cuda"]
    arch: str
    description: str = ""
    accelerator_type: str | None = Field(None, description="the GPU's name as Ray labels a node with it "
                                                           "(`accelerator_type:H100`); sweep cells on Ray need such a node")
    precisions: tuple[Precision, ...]
    backends: tuple[BackendName, ...]
    memory_bandwidth_gbs: float | None = Field(None, description="peak memory bandwidth, GB/s")
    peak_tflops: dict[str, float] = Field(default_factory=dict, description="dense peak per dtype, TFLOP/s or TOP/s")
    price_per_hour: float | None = Field(None, description="indicative USD per hour, for cost lines in reports")
    measured: str | None = Field(None, description="how the bandwidth and peak were measured on the build machine, "
                                                   "when the target is that machine and declares none")

    def require_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            raise RecipeError(
                f"target {self.name} ({self.description}) does not run {precision}",
                fix=f"choose one of its precisions: {', '.join(self.precisions)}",
            )


@cache
def _load(path: Path) -> dict[str, Target]:
    try:
        raw = load_yaml(path.read_text()) or {}
        return {name: Target(name=name, **fields) for name, fields in raw.items()}
    except (OSError, yaml.YAMLError, ValidationError, TypeError) as exc:
        raise RecipeError(f"cannot read targets file: {exc}", where=str(path)) from exc


def targets(path: Path | None = None) -> dict[str, Target]:
    """Every declared target by name (the bundled ``targets.yaml`` unless a path is given)."""
    return dict(_load(Path(path or TARGETS_FILE)))


def get_target(name: str, path: Path | None = None) -> Target:
    known = targets(path)
    if name not in known:
        raise RecipeError(f"unknown target {name!r}", fix=f"use one of: {', '.join(known)} (see `infopt targets`)")
    return known[name]
