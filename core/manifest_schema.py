"""The manifest's types: what ``manifest.json`` holds, checked when a build writes it and when
``load``, ``validate`` and ``gate`` read it. ``manifest.schema.json`` (shipped beside this module)
is generated from these models; ``tests/optimize/test_manifest_schema.py`` keeps the two equal.

``core/manifest.py`` reads and writes it; every reader uses these models' attributes. Each
section a consumer relies on is typed; sections whose contents are a pass's or a validator's own
tables (``details``, ``drift``, ``curve``, ``work``, ``candidates``, ``triton_tuning``) are typed as
objects, and extra keys are kept, so a manifest written by a newer infopt of the same schema
version still reads.
"""

from __future__ import annotations

import json
import math
import sys
from importlib.resources import files
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infopt.core.errors import BuildError, UsageError
from infopt.core.inputspec import InputSpec
from infopt.core.lineage import PassRecord

SCHEMA_VERSION = "infopt.manifest/1"
SCHEMA_FILE = "manifest.schema.json"


class _Open(BaseModel):
    # a field's docstring is its description in the JSON schema (and in docs/reference/manifest.md)
    model_config = ConfigDict(extra="allow", validate_assignment=True, use_attribute_docstrings=True)


class HubSource(_Open):
    repo_id: str
    """the model's id on the hub (``org/name``)"""
    revision: str
    """as asked"""
    commit: str
    """what the revision resolved to when the model was built"""


class TaskInfo(_Open):
    name: str
    """feature-extraction, sentence-embedding, classification, question-answering, causal-lm, image or audio"""
    judged_by: str
    """the drift figure that tells this task's outputs apart"""


class Source(_Open):
    path: str
    """the model file or folder as given, or ``(in-memory module)`` for the Python API"""
    format: str
    """how it was read: TorchScript, ``pt2``, state dict, ``onnx``, a Hugging Face folder..."""
    sha256: str | None = None
    """a file source: its sha256; an in-memory module: that of its weights"""
    files: dict[str, str] | None = None
    """a folder source: each file's sha256"""
    hub: HubSource | None = None
    """a Hugging Face model id: the repository and the commit it was built from"""
    task: TaskInfo | None = None
    """a Hugging Face folder: the task it was built as"""


class TargetInfo(_Open):
    name: str
    """the target's name, as ``--target`` gives it"""
    description: str = ""
    """the hardware, in words"""
    device: Literal["cpu", "cuda"]
    """where the target runs the model"""
    arch: str = ""
    """the CPU or GPU architecture (``x86_64``, ``sm_90``)"""
    precisions: list[str] = Field(default_factory=list)
    """the precisions it builds"""
    backends: list[str] = Field(default_factory=list)
    """the backends it runs"""
    memory_bandwidth_gbs: float | None = None
    """memory bandwidth in GB/s, for the roofline"""
    peak_tflops: dict[str, float] = Field(default_factory=dict)
    """peak throughput per precision in TFLOP/s (TOP/s for integers)"""
    price_per_hour: float | None = None
    """USD per hour, for the report's cost per million predictions"""
    accelerator_type: str | None = None
    """the GPU's name as Ray labels a node (``infopt sweep --ray``)"""
    measured: str | None = None
    """how the bandwidth and peak were measured on the build machine (the ``cpu`` target)"""


class TensorInfo(_Open):
    name: str
    """the tensor's name in the model file"""
    dtype: str
    """its element type (``float32``, ``int64``...)"""
    shape: list[int | str]
    """its dims: a number, or the name of a symbolic dim"""


class DimInfo(_Open):
    min: int
    """the smallest size the model takes"""
    opt: int
    """the size it is tuned for"""
    max: int
    """the largest size it takes"""


class Inputs(_Open):
    inputs: list[TensorInfo]
    """each input, in the order the model takes them"""
    dims: dict[str, DimInfo] = Field(default_factory=dict)
    """each symbolic dim's range, by name (``--dim``)"""


class Verdict(_Open):
    passed: bool
    """whether every check held"""
    reasons: list[str] = Field(default_factory=list)
    """why it failed, one line per check missed"""
    checks: list[Any] = Field(default_factory=list)
    """each check: its name, what was measured, the limit, and whether it passed"""


class LatencyRow(_Open):
    """One runner's latency at one batch size (``validators/timing.py`` measures it)."""

    runner: str
    """``eager`` (the source model in PyTorch) or ``infopt`` (the shipped model)"""
    batch: int
    """the batch size"""
    p50_ms: float
    """the median of the blocks' medians"""
    p90_ms: float
    """the 90th percentile, in ms"""
    p99_ms: float
    """the 99th percentile, in ms"""
    mean_ms: float
    """the mean, in ms"""
    throughput: float
    """samples per second at the p50: batch / p50"""
    iterations: int
    """timed runs (fewer than asked when the median was pinned early)"""
    blocks: int = 1
    """blocks the runs were timed in, taking turns with the other runners; the p50 is their medians' median"""
    spread: float = 0.0
    """(slowest block median - fastest) / p50, leaving out the slowest and fastest block when there are 4
    or more: one odd block moves neither the p50 nor this; two or more that disagree (above 0.25) are a noisy machine"""


class Validation(_Open):
    device: str
    """where the shipped model was validated and timed, in words"""
    runs_on: str | None = None
    """the device of that runner (``cpu``, ``cuda``)"""
    notes: list[str] = Field(default_factory=list)
    """what the build says about its measurements"""
    timing_notes: list[str] = Field(default_factory=list)
    """what the timings themselves say (a noisy machine): they differ between two builds, as timings do"""
    drift: dict[str, Any] = Field(default_factory=dict)
    """the shipped model's drift from eager PyTorch on the stored samples, by metric"""
    latency: list[LatencyRow] = Field(default_factory=list)
    """eager's and the shipped model's latency at each batch size timed"""
    curve: list[dict[str, Any]] = Field(default_factory=list)
    """the shipped model's latency at each batch size: batch, p50_ms, ..., throughput"""
    work: dict[str, Any] | None = None
    """FLOPs and bytes moved per prediction (``validators/roofline.count_work``)"""
    stored_samples: int | None = None
    """how many inputs ``validation/samples.npz`` holds"""
    verdict: Verdict
    """passed or not, and why"""


class DataRecord(_Open):
    source: str
    """the data as given (a file, a folder, ``module:function``, or random inputs)"""
    samples: int
    """how many samples were used"""
    sha256: str
    """a hash of the samples, so two builds on the same data can be told"""


class Provenance(_Open):
    command: str | None = None
    """the ``infopt`` command line that built it"""
    python_call: str | None = None
    """the Python API call that built it, where no command did"""
    recipe: str
    """the shipped recipe's name, or its file"""
    settings: dict[str, Any] = Field(default_factory=dict)
    """the build settings the user gave (``--int4-method``, ``--calib-method``, ``--batch-sizes``...): the passes that
    take one put it in their options over the recipe's"""
    calibration: DataRecord | None = None
    """the calibration data (``--calib``)"""
    validation_data: DataRecord | None = None
    """the validation data (``--val``, or random inputs)"""


class FileEntry(_Open):
    bytes: int
    """the file's size"""
    sha256: str
    """the file's sha256, which ``verify`` and ``validate`` check"""


class Artifacts(_Open):
    model: str
    """``model/model<suffix>``; every other key is a server's folder (``servers/<name>``) or a file"""

    def get(self, name: str) -> str | None:
        """What the build wrote for ``name`` (a server, or a file a pass attached); None if nothing."""
        return self.model if name == "model" else (self.model_extra or {}).get(name)

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None


class StepTime(_Open):
    step: str
    """a build step (load, validation, latency, curve, emit...) or a pass (capture, onnx_export, aoti_compile...)"""
    seconds: float
    """wall-clock seconds the step took"""
    of: str | None = None
    """the candidate (recipe) a pass ran for; a pass candidates share ran once, for the first"""


class Timings(_Open):
    """Where the build's time went (``core/step_times.py``)."""

    total_s: float
    """from the call to the manifest written, less writing the reports and the manifest itself"""
    steps: list[StepTime]
    """each step and pass, in the order it ran"""


class Manifest(_Open):
    """``manifest.json`` of an output folder."""

    schema_: Literal["infopt.manifest/1"] = Field(alias="schema")
    """the manifest's schema and version; a reader refuses another"""
    name: str
    """the model's name (``--name``, by default the source file's stem)"""
    created: str
    """when the build wrote it, in UTC (ISO 8601)"""
    source: Source
    """the model built from: its path, format and hashes"""
    target: TargetInfo
    """the target built for, as ``recipes/targets.yaml`` describes it"""
    precision: str
    """what the model computes in"""
    precision_asked: str | None = None
    """set when it differs from ``precision``: INT8 asked, FP32 shipped because it was faster here"""
    backend: str
    """the backend that runs the shipped model"""
    inputs: Inputs
    """the model's inputs and the ranges of their symbolic dims"""
    outputs: list[TensorInfo]
    """the model's outputs"""
    recipe: dict[str, Any]
    """the recipe of the shipped candidate, as it ran"""
    passes: list[PassRecord]
    """the shipped model's lineage: each pass, in order"""
    validation: Validation
    """drift, latency and the verdict, measured on the stored samples"""
    versions: dict[str, str]
    """the versions of infopt and the libraries the build used"""
    candidates: list[dict[str, Any]] = Field(default_factory=list)
    """one row per candidate recipe: its verdict, drift and timings, or why it was skipped"""
    selection: str | None = None
    """why the shipped candidate was chosen"""
    provenance: Provenance | None = None
    """how to build it again: the command, the recipe, the settings and the data"""
    artifacts: Artifacts
    """where the model file and each server's folder are"""
    triton_tuning: dict[str, Any] | None = None
    """the dynamic batcher and instance settings tuned for Triton"""
    timings: Timings | None = None
    """where the build's time went"""
    files: dict[str, FileEntry]
    """every file of the output folder with its size and sha256"""

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    def pass_record(self, name: str) -> PassRecord | None:
        """The lineage entry of pass ``name`` (the first, if it ran twice); None if it was not in the recipe."""
        return next((p for p in self.passes if p.name == name), None)

    def input_spec(self) -> InputSpec:
        return InputSpec.from_json(self.inputs.model_dump())

    def to_json(self) -> dict[str, Any]:
        """The manifest as ``manifest.json`` holds it: the keys it was made with, non-finite floats as strings."""
        return jsonable(self.model_dump(by_alias=True, exclude_unset=True))


def jsonable(value: Any) -> Any:
    """Non-finite floats as strings ("inf", "-inf", "nan"), so the manifest is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def json_schema() -> dict[str, Any]:
    return Manifest.model_json_schema(by_alias=True)


def schema_text() -> str:
    """``manifest.schema.json`` as shipped: ``python -m infopt.core.manifest_schema > core/manifest.schema.json``."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def shipped_schema() -> dict[str, Any]:
    return json.loads((files("infopt.core") / SCHEMA_FILE).read_text())


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()[:3])


def check_written(manifest: dict[str, Any]) -> Manifest:
    """A build's manifest, typed, before anything reads or writes it; a mismatch is infopt's own bug,
    said as a build error."""
    try:
        return Manifest.model_validate(jsonable(manifest))
    except ValidationError as exc:
        raise BuildError(f"the manifest this build made does not fit {SCHEMA_VERSION}: {_problems(exc)}",
                         fix="report this with the command you ran; nothing was written") from None


def check_read(manifest: dict[str, Any], where: str) -> Manifest:
    """A manifest read back for ``load``, ``validate`` or ``gate``."""
    schema = manifest.get("schema")
    if schema != SCHEMA_VERSION:
        raise UsageError(f"{where} is a manifest of schema {schema!r}; this infopt reads {SCHEMA_VERSION}", where=where,
                         fix="rebuild the artifact with this infopt, or use the infopt that built it")
    try:
        return Manifest.model_validate(manifest)
    except ValidationError as exc:
        raise UsageError(f"{where} is not a manifest infopt wrote: {_problems(exc)}", where=where,
                         fix="rebuild the artifact; a manifest is written by `infopt build` and not edited") from None


if __name__ == "__main__":
    sys.stdout.write(schema_text())
