"""The release gate: a candidate artifact against a baseline, on the same inputs, in one process.

``gate(candidate, baseline)`` loads both output folders (or their manifests) and measures, in order:

1. integrity: each folder's files against its manifest (a mismatch is bad input, exit 2);
2. the candidate's drift from the eager model it was built from, on the samples stored at build
   (its ``validation/samples.npz`` holds the reference outputs), against the candidate recipe's
   thresholds plus the gate file's ``reference`` section;
3. the candidate's drift from the baseline's outputs on the validation inputs (``--val``, else the
   candidate's stored samples), against the ``baseline`` section;
4. with labels in the validation data, the task metric of each, and the candidate's drop from the
   baseline's score (``task``), so a retrained model is judged on its task;
5. the latency ratio at each batch size, timed side by side in interleaved trials
   (``validators/timing.py``): the gate fails only when the ratio's lower confidence bound
   is above ``latency.max_ratio``;
6. model size, and peak memory (each model loaded and run in a child process of its own).

Every build takes these steps; what a step measures is the task's (``judge_for``): for text-generation builds
``gating_generation.GenerationJudge`` measures accuracy by the task's evaluator and teacher forcing against the
baseline, and latency as TTFT and TPOT ratios, both folders run by ``onnxruntime_genai``.

Every figure is reported; a figure with no threshold is reported as "not gated".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from infopt.api import gating_generation
from infopt.api.emit import read_samples
from infopt.api.provenance import check_sealed
from infopt.core.errors import InfoptError, UsageError
from infopt.core.inputspec import InputSpec
from infopt.core.manifest import model_bytes, output_root, read_manifest
from infopt.core.manifest_schema import Manifest
from infopt.core.recipe import DriftThresholds, Validation
from infopt.core.sample_inputs import random_feed
from infopt.runtime.backends import manifest_runner
from infopt.runtime.worker import RunnerCrashed
from infopt.validators import drift as drift_mod
from infopt.validators.data import load_batches, split_batches
from infopt.validators.gate_config import GateConfig
from infopt.validators.gate_result import GateCheck, GateResult
from infopt.validators.memory import measure
from infopt.validators.task_metrics import read_labels, resolve
from infopt.validators.timing import paired, worker_clocks
from infopt.validators.verdict import CHECKS, judge

REPORTED_DRIFT = ("max_abs", "min_cosine", "min_sqnr_db", "min_top1")
"""Drift figures shown in the gate's table even when no threshold gates them."""


@dataclass
class BuiltFolder:
    """An output folder of ``infopt build``, its files checked against its manifest: a candidate or a baseline."""

    label: str
    root: Path
    manifest: Manifest

    @property
    def spec(self) -> InputSpec:
        return self.manifest.input_spec()

    def model_bytes(self) -> int:
        return model_bytes(self.root / self.manifest.artifacts.model)

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        return {"dist": str(self.root), "name": m.name, "recipe": m.recipe["name"], "precision": m.precision,
                "created": m.created, "build_passed": m.validation.verdict.passed}


def open_built_folder(path: str | Path, label: str, key: str | Path | None = None) -> BuiltFolder:
    """An output folder (or its manifest.json) whose files match its manifest (and, with ``key``,
    whose manifest's signature verifies); else exit 2."""

    root = output_root(path)
    if not root.exists():
        raise UsageError(f"the {label} {path} does not exist", fix="pass an output folder of `infopt build`, or its manifest.json")
    manifest = read_manifest(root)
    check_sealed(root, manifest, label, key)
    return BuiltFolder(label, root, manifest)


def check_same_model(candidate: BuiltFolder, baseline: BuiltFolder) -> None:
    """The two must take the same inputs and give the same outputs; else exit 2 naming the difference."""
    cs, bs = candidate.spec, baseline.spec
    problems = []
    if set(cs.names) != set(bs.names):
        problems.append(f"inputs {', '.join(cs.names)} vs {', '.join(bs.names)}")
    else:
        for c in cs.inputs:
            b = next(t for t in bs.inputs if t.name == c.name)
            fixed = [(x, y) for x, y in zip(c.shape, b.shape) if isinstance(x, int) or isinstance(y, int)]
            if c.dtype != b.dtype or len(c.shape) != len(b.shape) or any(x != y for x, y in fixed):
                problems.append(f"input {c.name} is {c} vs {b}")
    c_out, b_out = candidate.manifest.output_names, baseline.manifest.output_names
    if len(c_out) != len(b_out):
        problems.append(f"{len(c_out)} outputs ({', '.join(c_out)}) vs {len(b_out)} ({', '.join(b_out)})")
    if problems:
        raise UsageError(f"the baseline {baseline.root} is another model than the candidate {candidate.root}: " + "; ".join(problems),
                         fix="gate a candidate against an earlier build of the same model (same inputs and outputs)")


def _runner(artifact: BuiltFolder):
    """The artifact's runner; its files were checked when it was opened."""
    try:
        return manifest_runner(artifact.root, artifact.manifest, fenced=True)
    except InfoptError:
        raise
    except Exception as exc:  # noqa: BLE001 - a runtime that cannot read the model file
        raise UsageError(f"the {artifact.label}'s model {artifact.manifest.artifacts.model} cannot be loaded: "
                         f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                         where=str(artifact.root), fix=f"rebuild the {artifact.label}") from exc


def _drift_checks(group: str, report, thresholds) -> list[GateCheck]:
    verdict = judge(Validation(drift=thresholds), report.worst, [])
    checks = [GateCheck(group, c.name, c.measured, None, c.rule, c.passed) for c in verdict.checks]
    gated = {c.name for c in checks}
    for name, key, _ in CHECKS:
        if name in REPORTED_DRIFT and name not in gated and report.worst.get(key) is not None:
            checks.append(GateCheck(group, name, report.worst[key], None, "not gated", None))
    return checks


def _run(runner, batches: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    return [runner.run(b) for b in batches]


def gate(candidate: str | Path, baseline: str | Path, *, config: GateConfig | None = None, val: str | Path | None = None,
         max_val_samples: int = 1024, memory: bool = True, key: str | Path | None = None,
         progress: Callable[[str], None] | None = None) -> GateResult:
    """Gate ``candidate`` against ``baseline`` (output folders or their manifests); see the module doc. Every build
    takes the same steps; the task's judge (``judge_for``) measures accuracy and latency the task's way."""

    config = config or GateConfig()
    say = progress or (lambda _msg: None)
    cand, base = open_built_folder(candidate, "candidate", key), open_built_folder(baseline, "baseline", key)
    check_same_model(cand, base)
    result = GateResult(cand.describe(), base.describe())
    own = result.candidate["build_passed"]
    why = "" if own else "; ".join(cand.manifest.validation.verdict.reasons)
    result.checks.append(GateCheck("build", "candidate's own verdict", None, None, "passed", bool(own), why))
    judge = judge_for(cand, base)
    crashed = False
    try:
        judge.accuracy(result, config, cand, base, val, max_val_samples, say)
        _flag_ungated_accuracy(result)
        judge.latency(result, config, cand, base, say)
    except RunnerCrashed as exc:  # a model's native code ended the worker that ran it: a failed check, not a dead job
        crashed = True
        result.checks.append(GateCheck("runtime", "runs without crashing", None, None, "no crash", False, str(exc)))
    finally:
        judge.close()
    _size_checks(result, config, cand, base)
    if crashed:
        result.notes.append("a model crashed the process that ran it: accuracy, latency and memory were not measured")
    elif memory and judge.measures_memory:
        say("peak memory, each model in a process of its own")
        _memory_checks(result, config, cand, base)
    elif memory:
        result.notes.append(f"{judge.task} builds: peak memory is not measured")
    return result


def judge_for(cand: BuiltFolder, base: BuiltFolder):
    """The task's judge: text generation when either build generates (both must), else the logits judge."""
    if gating_generation.is_generation(cand.manifest) or gating_generation.is_generation(base.manifest):
        return gating_generation.GenerationJudge(same_source(cand, base))
    return LogitsJudge()


class LogitsJudge:
    """Accuracy as output drift (against the stored eager reference, then the baseline's outputs, then the task
    metric where the data has labels) and latency as paired ratios, both models loaded once."""

    task = "logits"
    measures_memory = True

    def __init__(self) -> None:
        self.runners: tuple = ()

    def accuracy(self, result: GateResult, config: GateConfig, cand: BuiltFolder, base: BuiltFolder, val, max_val_samples: int,
                 say) -> None:
        say("loading both models")
        cand_runner, base_runner = self.runners = _runner(cand), _runner(base)
        names = cand.manifest.output_names

        say("drift against the eager reference")
        stored_inputs, reference = read_samples(cand.root, cand.manifest)
        ref_report = drift_mod.compare([reference], [cand_runner.run(stored_inputs)], names,
                                       "candidate's validation/samples.npz")
        recipe_limits = cand.manifest.recipe["validation"]["drift"]
        overrides = config.reference.model_dump(exclude_none=True) if config.reference else {}
        result.checks += _drift_checks("reference", ref_report, DriftThresholds(**{**recipe_limits, **overrides}))

        spec = cand.spec
        max_batch = min(_max_batch(cand.spec), _max_batch(base.spec))
        if val is not None:
            batches = load_batches(val, spec, max_val_samples)
            load_batches(val, base.spec, max_val_samples)  # the baseline must accept them too
            source = str(val)
        else:
            batches, source = [stored_inputs], "the candidate's validation/samples.npz"
            result.notes.append("no --val data: candidate and baseline were compared on the candidate's stored samples, "
                                "which carry no labels, so no task metric was measured")
        counts = [int(next(iter(b.values())).shape[0]) if spec.batch_symbol else 1 for b in batches]
        run_batches = list(split_batches(batches, spec, max_batch))
        say("running both models on the validation inputs")
        cand_out, base_out = _run(cand_runner, run_batches), _run(base_runner, run_batches)
        base_report = drift_mod.compare(base_out, cand_out, names, source)
        limits, why = _baseline_limits(config, cand, base, base_report)
        result.checks += _drift_checks("baseline", base_report, limits)
        if why:
            result.notes.append(why)
        result.measurements["drift"] = {"reference": ref_report.to_json(), "baseline": base_report.to_json()}
        if val is not None:
            _task_checks(result, config, val, counts, names, cand_out, base_out)

    def latency(self, result: GateResult, config: GateConfig, cand: BuiltFolder, base: BuiltFolder, say) -> None:
        say("timing both models side by side")
        _latency_checks(result, config, cand, base, *self.runners, say)

    def close(self) -> None:
        self.runners = ()


DEFAULT_BASELINE_TOP1 = 0.99
"""Top-1 agreement with the baseline a candidate of the same source model must keep when no limit is given."""


def same_source(cand: BuiltFolder, base: BuiltFolder) -> bool:
    """Both built from the same model: the same file sha256 (or the same files, or the same weights)."""
    c, b = cand.manifest.source, base.manifest.source
    if c.sha256 and c.sha256 == b.sha256:
        return True
    return bool(c.files) and c.files == b.files


def _baseline_limits(config: GateConfig, cand: BuiltFolder, base: BuiltFolder, report) -> tuple[Any, str]:
    """The baseline section's limits; with none given and the same source model on both sides, the
    candidate recipe's drift limits and top-1 agreement >= 0.99 (for a classifier's outputs)."""

    if config.baseline.model_dump(exclude_none=True) or not same_source(cand, base):
        return config.baseline, ""
    limits = dict(cand.manifest.recipe["validation"]["drift"])
    if limits.get("min_top1") is None and report.worst.get("top1") is not None:
        limits["min_top1"] = DEFAULT_BASELINE_TOP1
    return DriftThresholds(**limits), ("both builds come from the same source model (same sha256), so the candidate's outputs "
                                       "were held to the baseline's by its recipe's drift limits"
                                       + (f" and top-1 agreement >= {DEFAULT_BASELINE_TOP1:g}" if "min_top1" in limits else ""))


def _flag_ungated_accuracy(result: GateResult) -> None:
    """When nothing judged accuracy (no baseline limit, no task metric), say so as a check of its own."""
    if any(c.group in ("baseline", "task") and c.passed is not None for c in result.checks):
        return
    result.checks.append(GateCheck(
        "accuracy", "not gated", None, None, "not gated", None, skipped=True,
        detail="ACCURACY WAS NOT GATED: the builds come from different source models, no --val labels gave a task "
               "metric and no baseline limit was set; pass --val with labels, or --min-baseline-cosine/--min-baseline-top1"))
    result.notes.append("accuracy was not gated: nothing here shows the candidate is as accurate as the baseline")


def _max_batch(spec: InputSpec) -> int:
    return spec.dims[spec.batch_symbol].max if spec.batch_symbol else 1


def _task_checks(result: GateResult, config: GateConfig, val, counts, names, cand_out, base_out) -> None:
    task = config.task
    labels = read_labels(val, task.labels, counts)
    if labels is None:
        if task.metric is not None:
            raise UsageError(f"task metric {task.metric} needs labels, and no sample file in {val} has a {task.labels!r} array",
                             fix=f"store the labels under {task.labels!r} beside the inputs (np.savez(..., {task.labels}=y)), "
                                 "or name the key with --labels")
        result.notes.append(f"the validation data has no {task.labels!r} labels, so no task metric was measured")
        return
    index = names.index(task.output) if task.output else 0
    if task.output and task.output not in names:
        raise UsageError(f"task.output {task.output!r} is not an output of the model", fix=f"its outputs are: {', '.join(names)}")
    cand_y = np.concatenate([o[index] for o in cand_out])
    base_y = np.concatenate([o[index] for o in base_out])
    metric = resolve(task.metric, labels, cand_y, task.higher_is_better)
    c_score, b_score = metric.fn(cand_y, labels), metric.fn(base_y, labels)
    sign = 1 if metric.higher_is_better else -1
    drop = sign * (b_score - c_score)
    result.measurements["task"] = {"metric": metric.name, "higher_is_better": metric.higher_is_better, "samples": int(labels.shape[0]),
                                   "candidate": c_score, "baseline": b_score, "drop": drop}
    limit = "not gated" if task.max_drop is None else f"drop <= {task.max_drop:g}"
    result.checks.append(GateCheck("task", metric.name, c_score, b_score, limit,
                                   None if task.max_drop is None else drop <= task.max_drop + 1e-12,
                                   f"{'worse' if drop > 0 else 'better'} than the baseline by {abs(drop):.4g}"))
    if task.min is not None:
        ok = c_score >= task.min if metric.higher_is_better else c_score <= task.min
        result.checks.append(GateCheck("task", f"{metric.name} (absolute)", c_score, None,
                                       f"{'>=' if metric.higher_is_better else '<='} {task.min:g}", ok))


def _latency_feeds(spec: InputSpec, sizes: list[int] | None, limit: int) -> dict[int, dict[str, np.ndarray]]:
    if spec.batch_symbol is None:
        return {1: random_feed(spec)}
    r = spec.dims[spec.batch_symbol]
    sizes = sizes or sorted({r.min, min(r.opt, limit)})
    bad = [b for b in sizes if not r.min <= b <= limit]
    if bad:
        raise UsageError(f"batch sizes {bad} are outside what both models take ({r.min}..{limit})",
                         fix="pass --batch-sizes within that range")
    return {b: random_feed(spec, **{spec.batch_symbol: b}) for b in sizes}


def _latency_checks(result, config, cand, base, cand_runner, base_runner, say) -> None:
    lat = config.latency
    feeds = _latency_feeds(cand.spec, lat.batch_sizes, min(_max_batch(cand.spec), _max_batch(base.spec)))
    cuda = cand_runner.device == "cuda" and base_runner.device == "cuda"
    estimates = paired(cand_runner.run, base_runner.run, feeds, trials=lat.trials, runs=lat.iterations,
                       warmup=lat.warmup, confidence=lat.confidence, cuda=cuda, progress=say,
                       clocks=worker_clocks(candidate=cand_runner, baseline=base_runner))
    result.measurements["latency"] = {"timer": "CUDA events" if cuda else "host clock", "estimates": [e.to_json() for e in estimates]}
    for e in estimates:
        detail = (f"median ratio {e.ratio:.3f} over {e.trials} interleaved trials, bounds [{e.lower:.3f}, {e.upper:.3f}] "
                  f"each at {e.confidence:.1%}; median trial {e.candidate_p50_ms:.3f} ms vs {e.baseline_p50_ms:.3f} ms")
        passed = None if lat.max_ratio is None else e.lower <= lat.max_ratio
        limit = "not gated" if lat.max_ratio is None else f"lower bound <= {lat.max_ratio:g}"
        result.checks.append(GateCheck("latency", f"ratio b{e.batch}", e.ratio, None, limit, passed, detail))


def _size_checks(result, config, cand, base) -> None:
    c, b = cand.model_bytes(), base.model_bytes()
    ratio = c / b if b else float("inf")
    result.measurements["size"] = {"candidate_bytes": c, "baseline_bytes": b, "ratio": ratio}
    limit = config.max_size_ratio
    result.checks.append(GateCheck("size", "model bytes ratio", ratio, None, "not gated" if limit is None else f"<= {limit:g}",
                                   None if limit is None else ratio <= limit, f"{c} vs {b} bytes"))


def _memory_checks(result, config, cand, base) -> None:
    batch = max(e["batch"] for e in result.measurements["latency"]["estimates"])
    c, b = measure(cand.root, batch), measure(base.root, batch)
    ratio = c["peak_rss_bytes"] / b["peak_rss_bytes"] if b["peak_rss_bytes"] else float("inf")
    result.measurements["memory"] = {"batch": batch, "candidate": c, "baseline": b, "ratio": ratio}
    limit = config.max_memory_ratio
    result.checks.append(GateCheck("memory", f"peak ratio b{batch}", ratio, None, "not gated" if limit is None else f"<= {limit:g}",
                                   None if limit is None else ratio <= limit,
                                   f"{c['peak_rss_bytes'] / 2**20:.1f} MiB vs {b['peak_rss_bytes'] / 2**20:.1f} MiB resident, "
                                   "loading the model and running one batch"))
