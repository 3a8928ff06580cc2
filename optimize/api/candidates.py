"""Candidates: every recipe a build may use, built and judged side by side, and the choice among them.

With ``--backend auto`` a build makes one candidate per bundled recipe for the target and
precision (ONNX Runtime, ONNX Runtime with transformer fusion, AOTInductor, TensorRT, ...). Those
this machine cannot build are listed with the reason. The rest are validated on the same inputs
(drift against one eager reference) and timed in one run, and the fastest that passes the drift
checks is chosen. When the target is a GPU and nothing could be timed on one here, CPU timings say
nothing about the target, so the choice follows the target's backend preference instead, and the
report says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infopt.api.build_inputs import outputs_on
from infopt.api.emit import onnx_outputs
from infopt.core.artifact import STAGE, Artifact
from infopt.core.errors import BuildError, first_line
from infopt.core.manifest import model_sha256
from infopt.core.pass_api import get_pass
from infopt.core.recipe import Recipe
from infopt.exporters.torch_export import exported_outputs
from infopt.runtime import backends
from infopt.runtime.runner import Runner
from infopt.runtime.worker import RunnerCrashed
from infopt.validators import machine, timing
from infopt.validators.range_ends import RangeFailure
from infopt.validators.roofline import count_work
from infopt.validators.timing import Timings, mix_text, weighted_geomean


@dataclass
class Candidate:
    recipe: Recipe
    status: str = "pending"
    """built, skipped (this machine cannot build it) or failed (its build raised)"""
    reason: str = ""
    artifact: Artifact | None = None
    runner: Runner | None = None
    outputs: list[tuple[str, str, tuple]] = field(default_factory=list)
    drift: Any = None
    verdict: Any = None
    chosen: bool = False
    probe_run: tuple[dict, list] | None = None
    """the roof probe's first run: its feed (the first validation batch) and outputs, which the drift check takes"""
    probe_share: float | None = None
    """the share of the machine's fp32 matmul peak it computed at in the roof probe, where the probe ran"""

    @property
    def label(self) -> str:
        return self.recipe.name

    def speedups(self, timings: Timings) -> dict[int, float]:
        """Eager's time over this candidate's at each batch size: the inverse of the median paired-trial ratio."""
        return {r.batch: 1 / r.ratio for r in timings.ratios.get(self.label, []) if r.ratio > 0}

    def speedup(self, timings: Timings, weights: dict[int, float] | None = None) -> float | None:
        """Geometric mean of the per-batch speedups, each batch size weighted by its share of requests when
        ``weights`` (``--batch-mix``) declares them."""
        return weighted_geomean(self.speedups(timings), weights)


SOURCE_REASON = "needs the model's Python module"


def blocked_reason(recipe: Recipe, target, source_kind: str, python_module: bool = True) -> str | None:
    """Why ``recipe`` cannot be built here for ``target`` from a ``source_kind`` model, or None.
    ``python_module``: whether the source is an ``nn.Module`` with Python layers (not TorchScript,
    ``.pt2`` or ONNX), which a pass that declares ``needs_python_module`` (INT4 layer by layer) needs unless a step
    of the recipe stands in for it (``Pass.stands_in_for``: INT4 on the ONNX graph)."""

    steps = [get_pass(s.name) for s in recipe.passes]
    if not python_module:
        covered = {name for step in steps for name in step.stands_in_for}
        needing = next((step for step in steps if step.needs_python_module and step.name not in covered), None)
        if needing is not None:
            return f"{recipe.precision.upper()} through {recipe.backend} {SOURCE_REASON} ({needing.needs_python_module})"

    compile_step = next((step for step in steps if step.produces in ("aoti", "tensorrt")), None)
    if compile_step is not None and STAGE[compile_step.consumes] < STAGE[source_kind]:
        return f"{compile_step.name} needs the model as {compile_step.consumes}, and the source is already {source_kind}"
    return backends.named(recipe.backend).unavailable(recipe.precision, target.device)


ROOF_SHARE = 0.65
"""A first candidate that computes at this share (or more) of the machine's measured fp32 matmul peak leaves the
others little worth their build: the model is already about as fast as this machine multiplies, and another
backend's gain lies in the few ops that are not matmuls, while its build costs minutes. 0.65 lies between an
encoder that ran near the peak, where another backend gained nothing, and one that ran well below it
(benchmarks/results/rules.md)."""


PROBE_RUNS = 2
"""timed runs of the probe, the first (the session's warm-up) included; the fastest counts (a slow spell of the
machine, or a first run's allocations, only slow a run down, so the figure errs toward building the others).
BERT-large at batch 8 ran 2.6-3.4 s a run here, at 75-95 % of the peak: two runs decide it as three did, 5 s
sooner. The first run's outputs are the candidate's on that validation batch for the drift check
(:func:`validation_outputs`), so only the second is run for the probe alone."""
PROBE_AFTER_S = 20.0
"""the probe runs only where the first candidate took at least this long to build: where builds take seconds,
building the others costs less than being wrong about them. It sits below BERT-large's first candidate's build
time, so that the probe runs there every time (benchmarks/results/rules.md)"""
PROBE_MIN_RUN_S = 0.01
"""a run shorter than this is the runtime's overhead as much as arithmetic: its FLOP rate says nothing"""


def build_seconds(candidate: Candidate, elapsed_s: float) -> float:
    """What building ``candidate`` costs: ``elapsed_s``, plus, for each of its steps served from infopt's cache, what
    that step took in the build that stored it (a rebuild of BERT-large exports in 4 s what took 20 s, and was not
    probed, so it built the candidates its first build had skipped: 158 s against 97)."""
    saved = 0.0
    for record in candidate.artifact.lineage if candidate.artifact is not None else []:
        details = record.details or {}
        if details.get("cached") and details.get("seconds"):
            saved += float(details["seconds"])
    return elapsed_s + saved


def roof_probe(first: Candidate, feed: dict, spec, module, target, built_in_s: float = math.inf) -> str | None:
    """Why the candidates after ``first`` are not worth building, or None: ``first``'s FLOP rate on ``feed`` (the
    fastest of ``PROBE_RUNS`` runs) against the target's fp32 peak, where the target is this CPU
    and the build is FP32, and ``first`` took ``PROBE_AFTER_S`` or more to build (``built_in_s``). FLOPs are counted
    on the eager module on ``feed`` at batch 1 (the inputs whose first dim is the batch, sliced), times the batch. A
    share past 1 of a peak measured on this machine means the peak was measured while something else ran (it is kept
    for a day): it is measured again, and kept, before the share decides."""
    peak = (target.peak_tflops or {}).get("fp32")
    if (target.device != "cpu" or not peak or module is None or first.recipe.precision != "fp32"
            or built_in_s < PROBE_AFTER_S):
        return None
    batched = {t.name for t in spec.inputs if t.shape and t.shape[0] == spec.batch_symbol} if spec.batch_symbol else set()
    batch = int(feed[next(iter(batched))].shape[0]) if batched else 1
    one = {name: value[:1] if name in batched else value for name, value in feed.items()}
    flops = count_work(module, one, spec.names, 0, batch=1).get("flops_per_sample")
    if not flops:
        return None
    started = time.perf_counter()
    first.probe_run = feed, first.runner.run(feed)  # the drift check's outputs on this batch: not run again there
    clock = first.runner.clock or timing.host_timer
    seconds = min([time.perf_counter() - started] + [clock(first.runner.run, feed) for _ in range(PROBE_RUNS - 1)])
    if seconds < PROBE_MIN_RUN_S:
        return None
    share = flops * batch / seconds / (peak * 1e12)
    if share > 1 and target.measured:  # past the peak: that peak was measured on a busy machine, and kept
        peak = machine.measured_roof(fresh=True)[1]
        share = flops * batch / seconds / (peak * 1e12)
    first.probe_share = share
    if share < ROOF_SHARE:
        return None
    return (f"not built: {first.label} already computes at {share:.0%} of this machine's measured fp32 matmul peak "
            f"({flops * batch / 1e9:.0f} GFLOP in {seconds:.2f} s at batch {batch}), so another backend has little "
            f"to gain for the minutes its build takes; --recipe {{recipe}} builds it")


def validation_outputs(candidate: Candidate, batches: list[dict]) -> list:
    """``candidate``'s outputs on every validation batch, the roof probe's run taken (once) where it ran there."""
    known, candidate.probe_run = candidate.probe_run, None
    return outputs_on(candidate.runner, batches, known)


def drop_duplicates(candidates: list[Candidate]) -> None:
    """A candidate whose model file is byte-identical to an earlier one's (a fusion variant that
    found nothing to fuse) is the same model: it is marked skipped rather than timed twice."""

    seen: dict[str, str] = {}
    for c in candidates:
        if c.status != "built":
            continue
        digest = model_sha256(c.artifact.path)
        if digest in seen:
            c.status, c.reason, c.runner = "skipped", f"the same model file as {seen[digest]}", None
        else:
            seen[digest] = c.label


def validation_runner(artifact: Artifact, target) -> Runner:
    """The runner a candidate is validated with: its own runtime, on the target's device where present, in a worker
    process where its native code can crash the one that runs it (``runtime/worker.py``)."""
    return backends.runner_for_file(artifact.path, artifact.spec.names, artifact.output_names, device=target.device,
                                    fenced=True)


def runner_description(runner: Runner) -> str:
    backend = backends.for_runner(runner)
    return backend.describe(runner) if backend else getattr(runner, "description", f"{runner.device} ({runner.kind})")


def artifact_outputs(artifact: Artifact) -> list[tuple[str, str, tuple]]:
    """(name, dtype, shape) of the final model's outputs, whatever its representation; a TensorRT
    engine's are those of the ONNX model it was built from (``artifact.obj``, see
    ``tensorrt_build.engine_artifact``)."""

    if artifact.kind == "aoti":
        return exported_outputs(artifact.obj, artifact.spec, artifact.output_names)
    if artifact.kind == "tensorrt":
        return onnx_outputs(Path(artifact.obj))
    return onnx_outputs(artifact.path)


def choose(candidates: list[Candidate], timings: Timings, target, weights: dict[int, float] | None = None
           ) -> tuple[Candidate, str]:
    """The candidate to ship and why: the fastest that passed (``timing.choose``), or the target's preference."""
    built = [c for c in candidates if c.status == "built"]
    passed = [c for c in built if c.verdict.passed]
    if len(built) == 1:
        return built[0], "the only candidate built"
    if not passed:
        return built[0], "no candidate passed validation; the first by the target's backend preference is kept"
    on_target = target.device == "cpu" or any(c.runner.device == "cuda" for c in passed)
    if target.device == "cuda" and on_target:  # figures from the GPU beat any from this CPU (an ONNX Runtime
        gpu = [c for c in passed if c.runner.device == "cuda"]  # session that fell back to it, say)
        if len(gpu) == 1 and len(passed) > 1:
            return gpu[0], "the only candidate that passed validation on the GPU; the others ran on this CPU"
        passed = gpu
    if not on_target:
        return passed[0], (f"latency here was measured on this machine's CPU, which says nothing of {target.name}: "
                           f"chosen by the target's backend preference ({', '.join(target.backends)}) among "
                           "those that passed")
    picked = timing.choose(timings.ratios, weights, among=[c.label for c in passed]).name
    best = next((c for c in passed if c.label == picked), passed[0])
    how = f"weighted by the declared batch mix ({mix_text(weights)})" if weights else "across batch sizes"
    return best, (f"the fastest (geometric mean of its speedup over eager in paired trials, {how}) of those that "
                  "passed validation")


def table(candidates: list[Candidate], timings: Timings, weights: dict[int, float] | None = None) -> list[dict[str, Any]]:
    """The candidate rows for the manifest and report."""
    rows = []
    for c in candidates:
        row: dict[str, Any] = {"recipe": c.label, "backend": c.recipe.backend, "status": c.status,
                               "reason": c.reason, "chosen": c.chosen}
        if c.status == "built":
            worst = c.drift.worst
            p50 = {t.batch: t.p50_ms for t in timings.of(c.label)}
            row.update({"passed": c.verdict.passed, "failed_checks": c.verdict.reasons,
                        "cosine_min": worst.get("cosine_min"), "max_abs": worst.get("max_abs"),
                        "p50_ms": {str(b): v for b, v in p50.items()},
                        "speedup": c.speedup(timings, weights), "speedup_range": speedup_ranges(c.label, timings),
                        "runs_on": runner_description(c.runner),
                        "timing": timings.dropped.get(c.label, "timed in full"),
                        "size_bytes": c.artifact.size_bytes()})
        rows.append(row)
    return rows


def speedup_ranges(label: str, timings: Timings) -> dict[str, list[float]]:
    """Batch size -> [low, high, confidence]: the interval of the candidate's speedup over eager (the inverse
    of its paired-trial ratio's bounds) and the two-sided confidence with which it holds the true median."""
    return {str(r.batch): [1 / r.upper, 1 / r.lower, max(0.0, 2 * r.confidence - 1)]
            for r in timings.ratios.get(label, []) if r.lower > 0 and r.upper > 0}


def run_candidate(candidate, work):
    """``work()`` on a built candidate; the artifact failing to run on valid inputs is a build error naming it."""
    try:
        return work()
    except Exception as exc:  # noqa: BLE001 - the runtime's own errors, of many types

        candidate.status, candidate.reason = "failed", (
            f"the built model does not take its whole dim range: {exc}" if isinstance(exc, RangeFailure)
            else crash_reason(exc) if isinstance(exc, RunnerCrashed)
            else f"the built model fails to run: {type(exc).__name__}: {first_line(exc)}")
        return None


def without_crashed(candidates, work):
    """``work(built)`` over the built candidates; where a candidate's worker process dies during it
    (``RunnerCrashed``), that candidate fails with the crash as its reason and ``work`` runs again without it. The
    crash is raised when no candidate is left, or when no worker died (the crash was someone else's)."""
    while True:
        built = [c for c in candidates if c.status == "built"]
        try:
            return work(built)
        except RunnerCrashed as exc:
            dead = [c for c in built if getattr(c.runner, "dead", False)]
            if not dead or len(dead) == len(built):
                raise
            for c in dead:
                c.status, c.reason = "failed", crash_reason(exc)


CRASH_REASON_CHARS = 900
"""a crash's reason in the candidates table: the signal and the end of the worker's stack, on one line"""


def crash_reason(exc: RunnerCrashed) -> str:
    """A worker's crash as a candidate's reason: its message on one line (the stack's lines joined by `` | ``), the
    start and the end kept where it is long."""
    text = " | ".join(line.strip() for line in exc.what.splitlines() if line.strip())
    if len(text) > CRASH_REASON_CHARS:
        text = text[:CRASH_REASON_CHARS // 2] + " ... " + text[-CRASH_REASON_CHARS // 2:]
    return f"{exc.word}: {text}"


def survivors(candidates, allow_partial: bool, target_device: str = "cpu") -> list:
    """The built candidates; a failed one stops the build (every failure named) when every one
    failed, or unless ``allow_partial`` (the default; ``--strict`` turns it off). With a failure, the
    survivors must include one that runs on the target's kind of device: a GPU build whose GPU
    candidates failed does not ship a CPU fallback."""
    failed = [c for c in candidates if c.status == "failed"]
    built = [c for c in candidates if c.status == "built"]
    listing = "; ".join(f"{c.label}: {c.reason}" for c in failed)
    if failed and (not built or not allow_partial):
        total = len([c for c in candidates if c.status != "skipped"])
        raise BuildError(f"{len(failed)} of {total} candidates failed: {listing}",
                         fix="fix the cause, or keep to the backends that build with --backend" +
                             ("" if not built else "; without --strict the best of the others ships and the "
                              "report lists the failures"))
    if failed and target_device != "cpu" and not any(c.runner.device == target_device for c in built):
        raise BuildError(f"every candidate that runs on {target_device} failed ({listing}); those left "
                         f"({', '.join(c.label for c in built)}) ran on the CPU, which says nothing of the target",
                         fix="fix the cause, or build for --target cpu to ship a CPU model")
    return built
