"""``infopt validate``: re-check an output folder as it stands: its files against the manifest, its model's drift
against the outputs stored at build, its latency, and the verdict against its recipe's thresholds (a
text-generation output by its task's evaluator)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from infopt.api import flags
from infopt.api.build_inputs import latency_feeds
from infopt.api.emit import SAMPLES_FILE, read_samples
from infopt.api.generation_check import validate_generation
from infopt.api.provenance import check_files
from infopt.api.signing import check_signature
from infopt.core.errors import UsageError
from infopt.core.manifest import read_manifest
from infopt.core.recipe import MIN_LATENCY_RUNS, Recipe
from infopt.runtime.backends import manifest_runner
from infopt.runtime.worker import RunnerCrashed
from infopt.validators import drift as drift_mod
from infopt.validators import timing
from infopt.validators.verdict import judge


def validate(dist_dir: str | Path, *, thresholds: dict[str, float] | None = None,
             batch_sizes: Sequence[int] | None = None, progress: bool | Any = True,
             key: str | Path | None = None) -> dict[str, Any]:
    """Re-check an output folder: file integrity against the manifest, drift of its model against
    the stored reference outputs, latency, and the verdict against the recipe's thresholds. A text-generation
    output is judged by its task's evaluator instead (``generation_check.validate_generation``)."""

    root = Path(dist_dir)
    manifest = read_manifest(root)
    generates = manifest.recipe.get("task") == "text-generation" or "onnxruntime-genai" in manifest.artifacts
    if generates and (thresholds or batch_sizes):
        raise UsageError("a text-generation output is validated against its recipe's budgets (top-1 agreement, "
                         "perplexity, greedy tokens); drift thresholds and --batch-sizes do not apply to it",
                         where=str(root), fix="drop them")
    recipe = None if generates else flags.with_overrides(Recipe.from_json(manifest.recipe), thresholds, batch_sizes)
    spec = manifest.input_spec()
    if key is not None:
        check_signature(root, key)
    _, problems = check_files(root, manifest)
    result: dict[str, Any] = {"dist": str(root), "name": manifest.name, "integrity": problems or "ok"}
    if problems:
        result["verdict"] = {"passed": False, "reasons": [f"file check: {p}" for p in problems], "checks": []}
        return result
    if generates:
        return validate_generation(root, manifest, result)
    inputs, reference = read_samples(root, manifest)
    feeds = latency_feeds(spec, recipe, None)
    lat = recipe.validation.latency
    try:
        runner = manifest_runner(root, manifest, fenced=True)
        drift = drift_mod.compare([reference], [runner.run(inputs)], manifest.output_names,
                                  f"{SAMPLES_FILE} (stored at build)")
        timings = timing.measure({"infopt": runner.run}, feeds, warmup=lat.warmup, iterations=lat.iterations,
                                 devices={"infopt": runner.device}, seconds=lat.seconds, min_iterations=MIN_LATENCY_RUNS,
                                 clocks=timing.worker_clocks(infopt=runner)).stats
    except RunnerCrashed as exc:  # its native code ended the worker that ran it: a failed check, as a drift would be
        result["verdict"] = {"passed": False, "reasons": [f"the model crashed: {exc}"], "checks": []}
        return result
    verdict = judge(recipe.validation, drift.worst, [t.p99_ms for t in timings])
    result.update({"drift": drift.to_json(), "latency": [t.to_json() for t in timings], "verdict": verdict.to_json()})
    return result
