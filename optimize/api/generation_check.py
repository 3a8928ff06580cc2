"""``infopt validate`` of a text-generation output: its ONNX Runtime GenAI folder judged again by the task's
evaluator on the samples the build stored, and timed again, from the judging's own process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infopt.api.generation_flow import overflowed, time_folder
from infopt.core.errors import UsageError, first_line
from infopt.core.recipe import Recipe
from infopt.runtime.worker import RunnerCrashed
from infopt.validators import generation
from infopt.validators import generation_eval as evaluator


def validate_generation(root: Path, manifest, result: dict[str, Any]) -> dict[str, Any]:
    """``infopt validate`` of a text-generation output whose files match its manifest: its GenAI folder judged
    again by the task's evaluator on the stored prompts and held-out text, against the budgets the build was judged
    under (the recipe's, with the build's ``--max-drift`` in their place: its verdict's limits), and TTFT and TPOT
    timed again."""
    samples_file = root / evaluator.SAMPLES_FILE
    if not samples_file.is_file():
        raise UsageError(f"{root} holds no {evaluator.SAMPLES_FILE}: it was built before text-generation builds "
                         "stored what they are judged on", where=str(root), fix="rebuild it with this infopt")
    recipe = Recipe.from_json(manifest.recipe)
    built = {c.get("name"): c.get("limit") for c in manifest.validation.verdict.checks if isinstance(c, dict)}
    drift = ",".join(f"{metric}={built[metric]}" for metric in evaluator.METRICS if built.get(metric) is not None)
    budgets = evaluator.with_max_drift(recipe.validation.generation, drift or None)
    folder = root / manifest.artifacts.get("onnxruntime-genai")
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    samples = evaluator.GenerationSamples.load(samples_file)
    try:
        with generation.judging_worker() as judge:  # ONNX Runtime GenAI's native code runs there
            try:
                judged = evaluator.evaluate_in(judge, folder, samples, budgets)
            except RuntimeError as exc:  # onnxruntime_genai's errors are RuntimeErrors
                raise UsageError(f"onnxruntime_genai cannot generate from {folder}: {first_line(exc)}",
                                 where=str(folder), fix="rebuild the output") from exc
            timing = (time_folder(judge, folder, config["vocab_size"], config["context_length"])
                      if evaluator.finite(judged) else evaluator.not_timed(samples.new_tokens))
    except RunnerCrashed as exc:  # its native code ended the worker that ran it: a failed check, as for other models
        result["verdict"] = {"passed": False, "reasons": [f"the model crashed: {exc}"], "checks": []}
        return result
    if not judged["verdict"]["passed"] and overflowed(judged, manifest.passes):
        judged["verdict"]["reasons"].append(evaluator.OVERFLOW)
    result.update({"generation": {"greedy": judged["greedy"], "teacher_forced": judged["teacher_forced"], **timing,
                                  "budgets": evaluator.describe(budgets)},
                   "verdict": judged["verdict"]})
    return result
