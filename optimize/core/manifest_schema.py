"""The manifest's types: what ``manifest.json`` holds, checked when a build writes it and when
``load``, ``validate`` and ``gate`` read it. ``manifest.schema.json`` (shipped beside this module)
is generated from these models; ``tests/optimize/test_manifest_schema.py`` keeps the two equal.

Each section a consumer relies on is typed; sections whose contents are a pass's or a validator's
own tables (``details``, ``drift``, ``candidates``) are typed as objects, and extra keys are kept,
so a manifest written by a newer infopt of the same schema version still reads.
"""

from __future__ import annotations

import json
import sys
from importlib.resources import files
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infopt.core.errors import BuildError, UsageError
from infopt.core.lineage import PassRecord

SCHEMA_VERSION = "infopt.manifest/1"
SCHEMA_FILE = "manifest.schema.json"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Source(_Open):
    path: str
    format: str
    sha256: str | None = None
    files: dict[str, str] | None = None
    """a folder source: each file's sha256"""


class TargetInfo(_Open):
    name: str
    device: Literal["cpu", "cuda"]
    arch: str = ""
    precisions: list[str] = Field(default_factory=list)
    backends: list[str] = Field(default_factory=list)
    memory_bandwidth_gbs: float | None = None
    peak_tflops: dict[str, float] = Field(default_factory=dict)
    price_per_hour: float | None = None


class TensorInfo(_Open):
    name: str
    dtype: str
    shape: list[int | str]


class DimInfo(_Open):
    min: int
    opt: int
    max: int


class Inputs(_Open):
    inputs: list[TensorInfo]
    dims: dict[str, DimInfo] = Field(default_factory=dict)


class Verdict(_Open):
    passed: bool
    reasons: list[str] = Field(default_factory=list)
    checks: list[Any] = Field(default_factory=list)


class LatencyRow(_Open):
    batch: int
    runner: str
    p50_ms: float
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None


class Validation(_Open):
    device: str
    runs_on: str | None = None
    notes: list[str] = Field(default_factory=list)
    drift: dict[str, Any] = Field(default_factory=dict)
    latency: list[LatencyRow] = Field(default_factory=list)
    curve: list[dict[str, Any]] = Field(default_factory=list)
    verdict: Verdict


class DataRecord(_Open):
    source: str
    samples: int
    sha256: str


class Provenance(_Open):
    command: str | None = None
    python_call: str | None = None
    recipe: str
    calibration: DataRecord | None = None
    validation_data: DataRecord | None = None


class FileEntry(_Open):
    bytes: int
    sha256: str


class Artifacts(_Open):
    model: str
    """``model/model<suffix>``; every other key is a server's folder (``servers/<name>``) or a file"""


class Manifest(_Open):
    """``manifest.json`` of an output folder."""

    schema_: Literal["infopt.manifest/1"] = Field(alias="schema")
    name: str
    created: str
    source: Source
    target: TargetInfo
    precision: str
    """what the model computes in"""
    precision_asked: str | None = None
    """set when it differs from ``precision``: INT8 asked, FP32 shipped because it was faster here"""
    backend: str
    inputs: Inputs
    outputs: list[TensorInfo]
    recipe: dict[str, Any]
    passes: list[PassRecord]
    validation: Validation
    versions: dict[str, str]
    candidates: list[dict[str, Any]] = Field(default_factory=list)
    selection: str | None = None
    provenance: Provenance | None = None
    artifacts: Artifacts
    triton_tuning: dict[str, Any] | None = None
    files: dict[str, FileEntry]


def json_schema() -> dict[str, Any]:
    return Manifest.model_json_schema(by_alias=True)


def schema_text() -> str:
    """``manifest.schema.json`` as shipped: ``python -m infopt.core.manifest_schema > optimize/core/manifest.schema.json``."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def shipped_schema() -> dict[str, Any]:
    return json.loads((files("infopt.core") / SCHEMA_FILE).read_text())


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()[:3])


def check_written(manifest: dict[str, Any]) -> None:
    """A build's manifest before it is written; a mismatch is infopt's own bug, said as a build error."""
    try:
        Manifest.model_validate(manifest)
    except ValidationError as exc:
        raise BuildError(f"the manifest this build made does not fit {SCHEMA_VERSION}: {_problems(exc)}",
                         fix="report this with the command you ran; nothing was written") from None


def check_read(manifest: dict[str, Any], where: str) -> None:
    """A manifest read back for ``load``, ``validate`` or ``gate``."""
    schema = manifest.get("schema")
    if schema != SCHEMA_VERSION:
        raise UsageError(f"{where} is a manifest of schema {schema!r}; this infopt reads {SCHEMA_VERSION}", where=where,
                         fix="rebuild the artifact with this infopt, or use the infopt that built it")
    try:
        Manifest.model_validate(manifest)
    except ValidationError as exc:
        raise UsageError(f"{where} is not a manifest infopt wrote: {_problems(exc)}", where=where,
                         fix="rebuild the artifact; a manifest is written by `infopt build` and not edited") from None


if __name__ == "__main__":
    sys.stdout.write(schema_text())
