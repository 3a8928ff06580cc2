"""The release gate's thresholds: a gate file (YAML) and the flags that override it.

```yaml
reference:            # candidate against the eager model it was built from (its stored reference outputs)
  min_cosine: 0.99    # any of max_abs, mean_abs, max_rel, min_cosine, min_mean_cosine, min_sqnr_db, min_top1
baseline:             # candidate outputs against the baseline's, on the same inputs
  min_top1: 0.98
task:                 # needs labels in the validation data
  metric: accuracy    # accuracy, top5 (top-k), mse, or module:function
  labels: labels      # the key of the labels in each .npz/.pt sample file
  max_drop: 0.01      # fail if the candidate scores this much worse than the baseline
  min: 0.95           # fail if the candidate scores worse than this
latency:
  max_ratio: 1.10     # fail if candidate/baseline latency is above this with the stated confidence
  confidence: 0.95
  batch_sizes: [1, 8]
  trials: 15          # interleaved trials per batch size
  iterations: 10      # timed runs of each model per trial
generation:           # text-generation builds (both run by onnxruntime_genai)
  max_ppl_increase: 0.02  # relative perplexity increase over the baseline on --val text
max_size_ratio: 1.05  # model files, candidate/baseline
max_memory_ratio: 1.25
```

Every section and key is optional; an unknown key is an error that names it and lists the
known ones. Without a ``reference`` section the candidate's own recipe thresholds apply.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from infopt.core.errors import UsageError
from infopt.core.recipe import DriftThresholds
from infopt.core.yaml_files import load_yaml


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskGate(_Strict):
    metric: str | None = Field(None, description="accuracy, topK (e.g. top5), mse, or module:function(outputs, labels) -> float; "
                                                 "default: accuracy for integer labels, mse for float labels")
    labels: str = Field("labels", description="key of the labels in each .npz/.pt sample file")
    output: str | None = Field(None, description="the output the metric reads (default: the first)")
    higher_is_better: bool | None = Field(None, description="for a module:function metric (default true)")
    max_drop: float | None = Field(0.01, ge=0, description="largest allowed drop of the candidate's score below the baseline's")
    min: float | None = Field(None, description="smallest allowed candidate score (largest, for a lower-is-better metric)")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str | None) -> str | None:
        """Checked when the gate is configured, not when labels are first read: a gate whose data has no
        labels would otherwise pass with a metric that does not exist."""
        if value is None or value in ("accuracy", "mse") or re.fullmatch(r"top[1-9]\d*", value) \
                or re.fullmatch(r"[\w.]+:\w+", value):
            return value
        raise ValueError(f"unknown task metric {value!r}: the metrics are accuracy, topK (e.g. top5), mse, "
                         "or module:function(outputs, labels) -> float")


class LatencyGate(_Strict):
    max_ratio: float | None = Field(1.10, gt=0, description="largest allowed candidate/baseline latency ratio")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="confidence that the ratio exceeds max_ratio before the gate fails")
    batch_sizes: list[int] | None = Field(None, description="batch sizes to time (default: 1 and the batch dim's opt)")
    trials: int = Field(15, ge=5, description="interleaved trials per batch size")
    iterations: int = Field(10, ge=1, description="timed runs of each model per trial")
    warmup: int = Field(5, ge=0, description="untimed runs of each model before the trials")


class GenerationGate(_Strict):
    max_ppl_increase: float | None = Field(None, description="text-generation builds: largest allowed relative perplexity "
                                           "increase over the baseline on --val text (0.02 is 2 %); default: the candidate's "
                                           "own ppl_delta budget, else 0.02")


class GateConfig(_Strict):
    reference: DriftThresholds | None = Field(None, description="candidate vs the eager reference; default: the candidate's recipe")
    baseline: DriftThresholds = Field(default_factory=DriftThresholds, description="candidate vs baseline outputs")
    task: TaskGate = Field(default_factory=TaskGate)
    latency: LatencyGate = Field(default_factory=LatencyGate)
    generation: GenerationGate = Field(default_factory=GenerationGate)
    max_size_ratio: float | None = Field(None, gt=0, description="largest allowed candidate/baseline model size ratio")
    max_memory_ratio: float | None = Field(None, gt=0, description="largest allowed candidate/baseline peak memory ratio")


SECTIONS = {"reference": DriftThresholds, "baseline": DriftThresholds, "task": TaskGate, "latency": LatencyGate,
            "generation": GenerationGate}


def load_gate_file(path: str | Path | None) -> GateConfig:
    """The gate file's thresholds (all defaults without one)."""
    if path is None:
        return GateConfig()
    path = Path(path)
    try:
        raw = load_yaml(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read the gate file {path}: {exc.strerror or exc}",
                         fix="pass an existing YAML file to --gate-file") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"the gate file {path} is not valid YAML: {exc}", fix="fix the YAML syntax") from exc
    if raw is None:
        return GateConfig()
    if not isinstance(raw, dict):
        raise UsageError(f"the gate file {path} holds a {type(raw).__name__}, not a mapping of sections",
                         fix=f"write sections such as {', '.join(GateConfig.model_fields)}")
    return parse(raw, str(path))


def parse(raw: dict[str, Any], where: str) -> GateConfig:
    try:
        return GateConfig.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            parent = error["loc"][0] if len(error["loc"]) > 1 else None
            known = SECTIONS[parent].model_fields if parent in SECTIONS else GateConfig.model_fields
            raise UsageError(f"unknown key {loc!r} in the gate file", where=where,
                             fix=f"the keys{' of ' + str(parent) if parent else ''} are: {', '.join(known)}") from None
        message = str(error["msg"]).removeprefix("Value error, ")
        raise UsageError(f"gate setting {loc}: {message}", where=where,
                         fix="see `infopt gate --help` for the keys and their meaning") from None


def with_flags(config: GateConfig, **flags: Any) -> GateConfig:
    """``config`` with the command line's values on top (a flag left unset keeps the file's value).
    Flag names are ``section__key`` (``latency__max_ratio``) or a top-level key."""
    data = config.model_dump()
    for name, value in flags.items():
        if value is None:
            continue
        section, _, key = name.partition("__")
        if key:
            if data.get(section) is None:
                data[section] = {}
            data[section][key] = value
        else:
            data[section] = value
    return parse(data, "command line flags")
