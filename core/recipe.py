"""Recipe: a target's pass pipeline for one precision, with validation thresholds and emitters.

Recipes are YAML files in ``recipes/pipelines/`` named ``<precision>-<backend>.yaml``. Loading
one validates it into typed config (each pass's options against that pass's option model) and
it round-trips to JSON; the manifest records the recipe a build used.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infopt.core.artifact import STAGE
from infopt.core.errors import RecipeError
from infopt.core.pass_api import get_pass
from infopt.core.target import BackendName, Precision, Target, targets
from infopt.core.yaml_files import load_yaml
from infopt.recipes import PIPELINES_DIR


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PassStep(_Strict):
    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class DriftThresholds(_Strict):
    """Limits on the candidate's drift from the eager reference; ``None`` means unchecked."""

    max_abs: float | None = Field(None, ge=0, allow_inf_nan=False, description="largest absolute difference")
    mean_abs: float | None = Field(None, ge=0, allow_inf_nan=False, description="mean absolute difference")
    max_rel: float | None = Field(None, ge=0, allow_inf_nan=False, description="largest relative difference")
    min_cosine: float | None = Field(None, ge=-1, le=1, allow_inf_nan=False, description="smallest cosine similarity per sample")
    min_mean_cosine: float | None = Field(None, ge=-1, le=1, allow_inf_nan=False,
                                          description="smallest mean cosine similarity over the samples")
    min_sqnr_db: float | None = Field(None, allow_inf_nan=False, description="smallest signal-to-quantization-noise ratio, dB")
    min_top1: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description="smallest top-1 agreement for classifier outputs")


MIN_CURVE_RUNS = 3
"""Timed runs the curve takes at each batch size however long they last (a p50 needs a few)."""
MIN_LATENCY_RUNS = 4
"""Timed runs the latency step takes of each runner at each batch size however long they last: one a
block for four blocks, two ABBA trials, the fewest that give a ratio to eager with a confidence interval.
A fast model's rows take many more within ``seconds``; a slow one's are bound by the build's timing
budget (``validators/timing_budget.py``)."""
MIN_TRIAL_RUNS = 2
"""...and where each run is so slow that those four would take over twice a row's share of the budget, this
many: one ABBA trial, whose ratio to eager is given with its confidence (50 %). BERT-large at batch 8 runs
2.4 s here: its latency step took 30 s of a 97 s build, most of it a warm-up and four runs each of eager and of
the candidate at batch 8. Where even this many would take over twice the row's share, each runner keeps one run,
a single pair: BERT-large's batch-8 row (about 4 s a run) under a 13 s budget, one trial of which took 16 s."""


class LatencyConfig(_Strict):
    warmup: int = Field(10, ge=0, description="untimed runs before timing")
    iterations: int = Field(50, ge=1, description="timed runs per batch size")
    seconds: float = Field(2.0, gt=0, description="time per runner and batch size: each of the runs' blocks ends once "
                           f"its share of this is spent (at least {MIN_LATENCY_RUNS} runs in all), so a slow model is "
                           "timed in fewer runs")
    batch_sizes: list[int] | None = Field(None, description="batch sizes to time; default 1 and the batch dim's opt")
    max_p99_ms: float | None = Field(None, description="fail if p99 latency at any batch size exceeds this")
    curve_iterations: int = Field(20, ge=1, description="timed runs per batch size of the shipped model's latency-versus-batch curve")
    curve_seconds: float = Field(1.0, gt=0, description="time per batch size of the curve: timing stops at curve_iterations "
                                 f"runs or once this long is spent, whichever comes first (at least {MIN_CURVE_RUNS} runs)")


class GenerationBudgets(_Strict):
    """Limits on a text-generation build, measured under teacher forcing on held-out text against the FP32
    model; ``None`` means unchecked. An FP32 build is held to greedy tokens equal to the source model's."""

    min_top1: float | None = Field(None, ge=0, le=1, allow_inf_nan=False,
                                   description="smallest per-token top-1 agreement with the FP32 model")
    max_ppl_delta: float | None = Field(None, allow_inf_nan=False,
                                        description="largest relative perplexity increase over the FP32 model (0.05: 5 %)")
    greedy_equal: bool = Field(False, description="every prompt's greedy tokens equal the source model's")


class Validation(_Strict):
    drift: DriftThresholds = Field(default_factory=DriftThresholds)
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    generation: GenerationBudgets | None = Field(None, description="the budgets of a text-generation recipe")


class Recipe(_Strict):
    name: str
    precision: Precision
    backend: BackendName
    task: str | None = Field(None, description="the task the recipe builds (text-generation); none: a model's "
                                               "inputs to its outputs (logits), which every other recipe builds")
    description: str = ""
    devices: list[Literal["cpu", "cuda"]] | None = Field(
        None, description="the target devices --backend auto builds it for (none: every device); --recipe builds it "
                          "for any target")
    passes: list[PassStep]
    validation: Validation = Field(default_factory=Validation)
    emit: list[str] | None = Field(
        None, description="servers to write under servers/ (their registered names); none given: every server that "
                          "serves the backend (``runtime/backend.py``)")

    @model_validator(mode="after")
    def _check_passes(self) -> "Recipe":
        previous = None
        for step in self.passes:
            definition = get_pass(step.name)
            definition.parse_options(step.options)
            if previous is not None and definition.consumes != previous.produces:
                raise RecipeError(
                    f"recipe {self.name}: pass {step.name} consumes {definition.consumes} "
                    f"but {previous.name} produces {previous.produces}",
                    fix="order the passes so each consumes what the one before produces",
                )
            if STAGE[definition.produces] < STAGE[definition.consumes]:
                raise RecipeError(f"pass {step.name} moves the model back up the flow",
                                  fix="order the passes fx, then export, then onnx or lower passes (see `infopt recipes`)")
            previous = definition
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def preflight(self, target: Target, has_calibration: bool, settings=None) -> None:
        """Every step's pre-flight (``Pass.preflight``: its options with the build ``settings``, and its own check),
        before any slow work."""
        for step in self.passes:
            get_pass(step.name).preflight(step.options, target, has_calibration, settings)

    def with_pass_options(self, pass_options: dict[str, dict[str, Any]] | None) -> "Recipe":
        """The recipe with ``pass_options`` (pass name -> options) over its steps' own; a pass it lacks is an error."""
        if not pass_options:
            return self
        data = self.to_json()
        for pass_name, values in pass_options.items():
            steps = [s for s in data["passes"] if s["name"] == pass_name]
            if not steps:
                raise RecipeError(f"recipe {self.name} has no pass {pass_name!r} to set options on",
                                  fix=f"its passes are: {', '.join(s['name'] for s in data['passes'])}")
            for step in steps:
                step["options"] = {**step["options"], **values}
        return Recipe.from_json(data)

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> "Recipe":
        return _validated(json.loads(data) if isinstance(data, str) else data, "JSON")


def _validated(data: Any, where: str) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'recipe'}: {e['msg']}" for e in exc.errors())
        raise RecipeError(f"invalid recipe: {problems}", where=where) from exc


def load_recipe(path: str | Path) -> Recipe:
    """A recipe from a YAML file, or a bundled one by name (``fp32-inductor``)."""
    if not Path(path).exists() and str(path) in bundled_recipes():
        path = bundled_recipes()[str(path)]
    path = Path(path)
    try:
        data = load_yaml(path.read_text())
    except OSError as exc:
        raise RecipeError(f"cannot read recipe {path}: {exc.strerror}", where=str(path),
                          fix="pass a recipe YAML file, or a bundled recipe's name (see `infopt recipes`)") from exc
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe is not valid YAML: {exc}", where=str(path),
                          fix="fix the YAML; `infopt recipes` lists the bundled recipes to start from") from exc
    return _validated(data, str(path))


def bundled_recipes() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PIPELINES_DIR.glob("*.yaml"))}


def recipes_for(target: Target, precision: str, backend: str = "auto", task: str | None = None) -> list[Recipe]:
    """Every bundled recipe of ``task`` (None: the logits graph) that builds ``precision`` for ``target``: with
    ``backend="auto"`` one per backend the target lists (and each variant, ``<precision>-<backend>-<variant>``),
    in the target's order of preference; otherwise those of the one backend."""
    target.require_precision(precision)
    if backend != "auto" and backend not in target.backends:
        raise RecipeError(
            f"target {target.name} does not list backend {backend}",
            fix=f"use --backend auto or one of: {', '.join(target.backends)}",
        )
    order = target.backends if backend == "auto" else (backend,)
    bundled = bundled_recipes()
    stems = [stem for candidate in order for stem in sorted(bundled, key=lambda s: (s.count("-"), s))
             if stem == f"{precision}-{candidate}" or stem.startswith(f"{precision}-{candidate}-")]
    found = [r for r in (load_recipe(bundled[stem]) for stem in stems)
             if r.task == task and (r.devices is None or target.device in r.devices)]
    if not found:
        raise RecipeError(
            f"no bundled recipe builds {precision} for target {target.name}"
            + ("" if backend == "auto" else f" with backend {backend}"),
            fix=f"target {target.name} builds: {buildable(target) or '(nothing bundled)'}; or pass --recipe FILE",
        )
    return found


def backends_for(target: Target) -> dict[str, list[str]]:
    """Precision -> the backends a bundled recipe builds it with for ``target``, in its order of preference."""
    pairs = {tuple(stem.split("-")[:2]) for stem, path in bundled_recipes().items()
             if target.device in (_declared_devices(path) or (target.device,))}
    return {p: [b for b in target.backends if (p, b) in pairs] for p in target.precisions}


@functools.lru_cache(maxsize=None)
def _declared_devices(path: Path) -> tuple[str, ...] | None:
    """A recipe file's ``devices``, read without validating the recipe (which needs the passes registered)."""
    data = load_yaml(Path(path).read_text()) or {}
    return tuple(data["devices"]) if data.get("devices") else None


def buildable(target: Target) -> str:
    """What the bundled recipes build for ``target``: ``fp32 (onnxruntime, inductor); int8 (onnxruntime)``."""
    return "; ".join(f"{p} ({', '.join(b)})" for p, b in backends_for(target).items() if b)


PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


def build_table() -> dict[str, dict[str, list[str]]]:
    """Target -> precision -> backends: what each bundled target builds (the table in docs/guide/targets-and-backends.md)."""
    return {name: backends_for(target) for name, target in targets().items()}


def build_table_markdown() -> str:
    """:func:`build_table` as the Markdown table docs/guide/targets-and-backends.md shows."""
    lines = ["| target | " + " | ".join(PRECISIONS) + " |", "| --- |" + " --- |" * len(PRECISIONS)]
    for name, row in build_table().items():
        lines.append(f"| {name} | " + " | ".join(", ".join(row.get(p) or []) or "-" for p in PRECISIONS) + " |")
    return "\n".join(lines)


def find_recipe(target: Target, precision: str, backend: str = "auto") -> Recipe:
    """The preferred bundled recipe for a target and precision."""
    return recipes_for(target, precision, backend)[0]
