"""The logits task's flow (:class:`LogitsFlow`): one graph from the model's inputs to its outputs, built by every
candidate recipe for the target, each judged against the eager model for drift and timed, the best shipped.
``orchestrator.build`` runs its stages; the helpers here (the input spec, the reference runner) serve
``infopt inspect`` too."""

from __future__ import annotations

import contextlib
import copy
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from infopt.api import candidates as cand
from infopt.api import flags, provenance
from infopt.api.build_config import DEFAULT_MAX_VAL_SAMPLES, BuildConfig
from infopt.api.build_inputs import (
    latency_feeds,
    outputs_on,
    random_batch_count,
    raw_reader,
    same_shapes,
    validation_batches,
)
from infopt.api.build_notes import noise_notes, pass_notes, server_engine, shipped_precision
from infopt.api.build_result import BuildResult
from infopt.api.curve import measure_curve
from infopt.api.emit import base_manifest, source_info, store_samples, write_output
from infopt.api.provenance import call_text
from infopt.core import progress as progress_display
from infopt.core.errors import BuildError, EnvironmentProblem, InputSpecError, UsageError
from infopt.core.inputspec import InputSpec, parse_dim
from infopt.core.manifest import data_sha256, model_bytes
from infopt.core.pass_api import Settings
from infopt.core.pipeline import Pipeline, SharedPrefixes
from infopt.core.recipe import MIN_LATENCY_RUNS, MIN_TRIAL_RUNS, Recipe, load_recipe, recipes_for
from infopt.core.sample_inputs import capture_feed, id_high, random_feed
from infopt.core.step_times import StepTimes
from infopt.core.target import get_target
from infopt.core.threads import ENV as THREADS_ENV
from infopt.core.threads import thread_cap
from infopt.core.work_folders import clean_dead_work_folders, work_folder
from infopt.exporters.staging import MAX_NAME_BYTES, check_output, removed_if_stopped, staged_output
from infopt.exporters.torch_export import user_frame
from infopt.quantize.calib_data import load_calibration
from infopt.quantize.sensitivity import Budget
from infopt.runtime import backends, worker
from infopt.runtime.backends.onnxruntime import OrtRunner
from infopt.runtime.loading import check_against_onnx, from_module, load_model
from infopt.runtime.memory_estimate import check_fits
from infopt.runtime.runner import TorchRunner
from infopt.runtime.worker import RunnerCrashed
from infopt.validators import drift as drift_mod
from infopt.validators import machine, timing
from infopt.validators.data import spec_from_samples, split_batches
from infopt.validators.range_ends import check_range_ends, range_ends
from infopt.validators.roofline import count_work
from infopt.validators.timing_budget import TimingBudget
from infopt.validators.verdict import judge as verdict_of


def resolve_spec(loaded, inputs, dims, example_inputs, val) -> InputSpec:
    if isinstance(inputs, InputSpec):
        spec = inputs
    elif inputs:
        spec = InputSpec.parse([inputs] if isinstance(inputs, str) else list(inputs))
    elif example_inputs is not None:
        examples = list(example_inputs) if isinstance(example_inputs, (list, tuple)) else [example_inputs]
        spec = InputSpec.from_examples(examples, loaded.arg_names[: len(examples)] or None)
    elif loaded.spec is not None:
        spec = loaded.spec
    elif val is not None:
        spec = spec_from_samples(val, loaded.arg_names)
    else:
        raise InputSpecError(f"cannot tell what inputs {loaded.source or 'the model'} takes",
                             fix='pass --input "name:dtype[batch,...]" (one per input), example inputs, or --val samples')
    if dims:
        parsed = dict(parse_dim(d) for d in dims) if not isinstance(dims, dict) else dims
        spec = spec.with_dims(parsed)
    if loaded.format == "onnx":
        check_against_onnx(spec, loaded.spec)
    return spec


def reference_runner(loaded, spec):
    if loaded.format == "onnx":
        return OrtRunner(loaded.source, optimize=False)
    return TorchRunner(loaded.module, spec.names)


def gpu_eager_runner(loaded, spec, target) -> TorchRunner | None:
    """For a CUDA target on a machine with a GPU: the source module, in its own precision, on the
    GPU, so that candidates built for the GPU are timed against eager on the same device."""
    import torch  # heavy: the API module loads without it until a build runs

    module = loaded.module
    if target.device != "cuda" or not isinstance(module, torch.nn.Module) or not torch.cuda.is_available():
        return None
    return TorchRunner(copy.deepcopy(module).cuda().eval(), spec.names, device="cuda")


def check_forward(reference, spec: InputSpec, module) -> tuple[dict, list]:
    """The model's outputs on the capture's random inputs (the feed, and them): the first random validation batch
    where the dims' opt sizes are 2 or more, whose reference outputs they then are."""
    feed = capture_feed(spec, int_high=id_high(module))
    try:
        return feed, reference.run(feed)
    except Exception as exc:  # noqa: BLE001 - the user's forward

        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputSpecError(f"the model's forward fails on inputs shaped by the spec {spec}: {type(exc).__name__}: {first}",
                             where=user_frame(exc, module) if module is not None else None,
                             fix="check --input shapes and dtypes against what forward expects") from exc


def reference_outputs(reference, batches: list[dict], forward: tuple[dict, list] | None) -> tuple[list, int]:
    """The eager outputs on every validation batch, and how many were the forward check's (``forward``: its feed and
    outputs) rather than a run again: the first random batch is its feed."""
    outputs = outputs_on(reference, batches, forward)
    return outputs, sum(out is forward[1] for out in outputs) if forward is not None else 0


def _safe_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", text).strip("._") or "model"
    if len(name) > MAX_NAME_BYTES:
        raise UsageError(f"the model name {name[:40]}... is {len(name)} characters long; at most {MAX_NAME_BYTES} are allowed",
                         fix="pass a shorter --name")
    return name


class LogitsFlow:
    """The logits graph's build: candidates by target, backend and precision, judged against the eager model.
    ``orchestrator.build`` runs its stages in order."""

    task = "logits"

    def __init__(self, model: Any, example_inputs: Any, config: BuildConfig, console: Any,
                 command: Sequence[str] | None):
        self.model, self.example_inputs, self.config, self.console, self.command = (model, example_inputs, config,
                                                                                   console, command)
        self.times = StepTimes()
        self.force = config.emit.force
        self.status = None
        """the progress display from the judging until the timing ends"""

    def plan(self) -> None:
        """The candidates' recipes, checked against the target and the settings, and the output folder checked,
        before the model loads."""
        config, deploy = self.config, self.config.deploy
        judged, timed = config.validation, config.timing
        given = config.given()
        example = {"example_inputs": self.example_inputs} if self.example_inputs is not None else {}
        self.call = call_text(self.model, {**example, **given})
        target = get_target(deploy.target)
        if deploy.recipe:
            recipes = [load_recipe(deploy.recipe)]
            if recipes[0].task is not None:
                raise UsageError(f"recipe {recipes[0].name} builds {recipes[0].task}, not the logits graph",
                                 where=str(deploy.recipe),
                                 fix=f"build it with --task {recipes[0].task} (task='{recipes[0].task}')")
            target.require_precision(recipes[0].precision)
        else:
            recipes = recipes_for(target, deploy.precision or "fp32", deploy.backend)
        self.budget, thresholds = None, judged.thresholds
        if judged.max_drift is not None:
            self.budget = Budget.parse(judged.max_drift)
            thresholds = {**(thresholds or {}), self.budget.threshold_name: self.budget.threshold}
        batch_sizes = timed.batch_sizes
        self.mix = _batch_mix(timed.batch_mix, batch_sizes)
        if self.mix:
            batch_sizes = list(self.mix)
        flags.check_choices(config)
        self.settings = config.pass_settings(batch_sizes=list(batch_sizes or []), batch_mix=self.mix or {})
        self.recipes = [flags.with_overrides(r, thresholds, batch_sizes, deploy.pass_options) for r in recipes]
        for each in self.recipes:
            each.preflight(target, config.calib.calibration is not None, self.settings)
        if config.emit.output:  # before any work: a folder that cannot be written fails in a second, not after the load
            check_output(Path(config.emit.output).absolute(), self.force)
        worker.memory_cap()  # INFOPT_WORKER_MEMORY that is not an amount: exit 2 now, not when a worker starts
        for each in {backends.named(r.backend) for r in self.recipes}:  # each fenced backend's worker imports what
            if each.fenced(target.device):                               # it needs while this process loads,
                worker.prestart(each.worker_imports)                     # captures and exports
        if deploy.price_per_hour is not None:
            target = target.model_copy(update={"price_per_hour": deploy.price_per_hour})
        self.target = target

    def load(self) -> None:
        """The model, its input spec, its name and the output folder: the request the later stages read."""
        model, source, judged, calib = self.model, self.config.source, self.config.validation, self.config.calib
        with self.times.step("load"):
            if isinstance(model, (str, Path)):
                check_fits(model, f"a {'/'.join(sorted({r.precision for r in self.recipes}))} build")
                loaded = load_model(model, model_class=source.model_class, model_args=source.model_args,
                                    allow_pickle=source.allow_pickle)
            else:
                loaded = from_module(model.eval(), "module", None)
                loaded.source = None
        spec = resolve_spec(loaded, source.inputs, source.dims, self.example_inputs, judged.val)
        name = _safe_name(self.config.emit.name or loaded.name
                          or (Path(loaded.source).stem if loaded.source else type(model).__name__.lower()))
        output = self.config.emit.output
        # absolute from here on: servers' packagers and compilers run in other working directories
        self.out = (Path(output) if output else Path("dist") / name).absolute()
        self.loaded = loaded
        self.request = BuildRequest(
            spec, self.recipes, self.target, name, self.out, self.command, self.call, force=self.force, val=judged.val,
            max_samples=judged.max_val_samples, console=self.console, calibration=calib.calibration,
            calib_samples=calib.calib_samples, calib_seed=calib.calib_seed, tokenizer=source.tokenizer,
            budget=self.budget, allow_partial=judged.allow_partial and not judged.strict, batch_mix=self.mix,
            times=self.times, settings=self.settings)

    def dry_run(self) -> dict[str, Any]:
        return _plan(self.loaded, self.request)

    def prepare(self) -> None:
        """This machine's measured roof, for the roofline and the probe that skips candidates."""
        with self.times.step("machine roof"):
            self.request.target = _with_measured_roof(self.target)

    @contextlib.contextmanager
    def workspace(self) -> Iterator[None]:
        """The work folder the candidates are built in: removed at the end, and by ``stop_now`` when the build is
        stopped; the folders of builds killed outright (SIGKILL) removed first."""
        clean_dead_work_folders()
        try:
            with work_folder("build") as work, removed_if_stopped(Path(work)):
                self.work = Path(work)
                yield
        finally:
            self._status_stopped()

    def reference(self) -> None:
        """The model run once on the capture's inputs (the forward check), the calibration data read, and the eager
        outputs on the validation batches that every candidate is judged against."""
        ctx, loaded = self.request, self.loaded
        spec, times = ctx.spec, ctx.times
        self.artifact = artifact = loaded.with_spec(spec)
        self.reference_runner = reference = reference_runner(loaded, spec)
        with times.step("forward check"):
            forward = check_forward(reference, spec, loaded.module)
        probe = forward[1]
        if not artifact.output_names:
            artifact.output_names = ("output",) if len(probe) == 1 else tuple(f"output_{i}" for i in range(len(probe)))
        ctx.reader = raw_reader(loaded, ctx.tokenizer)  # a Hugging Face folder's text goes through its own tokenizer
        if ctx.calibration is not None:
            with times.step("calibration data"):
                ctx.calib = load_calibration(ctx.calibration, spec, samples=ctx.calib_samples, seed=ctx.calib_seed,
                                             tokenizer=ctx.tokenizer, hold_out=ctx.val is None, reader=ctx.reader)
        with times.step("validation data"):
            batches, self.source = validation_batches(spec, ctx.val, ctx.max_samples, loaded.module, ctx.calib,
                                                      ctx.reader, random_batch_count(times.seconds("forward check")))
        self.checked_on = f"{len(batches)} random batches (no --val data)" if self.source == "random" else self.source
        max_batch = spec.dims[spec.batch_symbol].max if spec.batch_symbol else 1
        self.batches = batches = list(split_batches(batches, spec, max_batch))
        with times.step("validation"):  # the eager outputs every candidate is judged against, and INT8 chooses by
            began = time.perf_counter()
            self.ref_out, taken = reference_outputs(reference, batches, forward)
            self.eager_run_s = (time.perf_counter() - began + taken * times.seconds("forward check")) / max(1, len(batches))
            # a --dim range the model itself cannot take is refused now, before any candidate's minutes of building
            self.ends = range_ends(spec, reference, loaded.module)

    def run_pipeline(self) -> None:
        """Each candidate recipe's pipeline run (:func:`_build_candidates`)."""
        ctx = self.request
        self.candidates = _build_candidates(self.work, self.artifact, ctx.recipes, ctx.target, ctx.console, ctx.calib,
                                            ctx.budget, self.batches, self.checked_on, ctx.allow_partial, ctx.times,
                                            self.ref_out, ctx.settings, self.loaded.module)

    def judge(self) -> None:
        """Each built candidate's drift from the eager outputs, and its run at the ends of the dim ranges; a
        candidate that crashes is dropped, or stops the build where none may be (``allow_partial``)."""
        ctx, candidates, batches, ref_out = self.request, self.candidates, self.batches, self.ref_out
        self.status = progress_display.status(ctx.console, "validating: drift against the eager reference")
        if self.status:
            self.status.start()
        with ctx.times.step("validation"):
            for c in [c for c in candidates if c.status == "built"]:
                c.drift = cand.run_candidate(c, lambda c=c: drift_mod.compare(
                    ref_out, cand.validation_outputs(c, batches), tuple(o[0] for o in c.outputs), self.source))
                if c.status == "built":
                    cand.run_candidate(c, lambda c=c: check_range_ends(c.runner, self.ends))
            self.built = cand.survivors(candidates, ctx.allow_partial, ctx.target.device)

    def time(self) -> None:
        """The survivors timed beside eager, each judged against its budgets (drift and p99 latency), the best
        chosen (:func:`candidates.choose`), and its latency curve over batch sizes measured."""
        ctx, candidates, built, spec, loaded = self.request, self.candidates, self.built, self.request.spec, self.loaded
        if self.status:
            self.status.update("validating: latency" + (f" of {len(built)} candidates" if len(built) > 1 else ""))
        self.lat_cfg = lat_cfg = built[0].recipe.validation.latency
        self.clock = clock = TimingBudget.after(ctx.times.elapsed())
        with ctx.times.step("latency"):
            self.eager = eager = gpu_eager_runner(loaded, spec, ctx.target) or self.reference_runner
            feeds = latency_feeds(spec, built[0].recipe, loaded.module)
            self.row_s = clock.latency_row_s(lat_cfg.seconds, 1 + len(built), len(feeds))
            # the feeds the validation ran every runner at (same shapes): warm, each run taking about eager's time
            self.warmed = warmed = {b: self.eager_run_s for b, feed in feeds.items()
                                    if any(same_shapes(feed, v) for v in self.batches)}

            def time_each(built):
                runners = {"eager": eager.run, **{c.label: c.runner.run for c in built}}
                return timing.measure(runners, feeds, warmup=lat_cfg.warmup, iterations=lat_cfg.iterations,
                                      seconds=self.row_s, min_iterations=MIN_LATENCY_RUNS, min_warmup=1,
                                      baseline="eager", warmed=warmed, least_slow=MIN_TRIAL_RUNS,
                                      drop_slower=timing.DROP_SLOWER,
                                      devices={"eager": eager.device, **{c.label: c.runner.device for c in built}},
                                      clocks=timing.worker_clocks(**{c.label: c.runner for c in built}))

            self.timings = timings = cand.without_crashed(candidates, time_each)
            built = cand.survivors(candidates, ctx.allow_partial, ctx.target.device)
        self._status_stopped()
        for c in built:
            c.verdict = verdict_of(c.recipe.validation, c.drift.worst, [t.p99_ms for t in timings.of(c.label)])
        chosen, self.why = cand.choose(built, timings, ctx.target, ctx.batch_mix)
        self.chosen, chosen.chosen = chosen, True
        with ctx.times.step("curve"):
            self.curve, self.untimed = measure_curve(chosen, spec, loaded.module, ctx.console,
                                                     {t.batch: t for t in timings.of(chosen.label)},
                                                     clock.left_after(ctx.times.seconds("latency")))

    def emit(self) -> BuildResult:
        """The chosen candidate's output folder: its model, the manifest (drift, latency, the candidates' table,
        notes, provenance), the reports and the server packages, staged and renamed into place."""
        ctx, loaded, chosen, timings, candidates = self.request, self.loaded, self.chosen, self.timings, self.candidates
        spec, target, batches = ctx.spec, ctx.target, self.batches
        final, recipe = chosen.artifact, chosen.recipe
        with ctx.times.step("work count"):
            flops = _work(loaded.module, spec, final.path)
        latency = [t.to_json() for t in timings.of("eager")]
        latency += [{**t.to_json(), "runner": "infopt"} for t in timings.of(chosen.label)]
        validation = {"device": cand.runner_description(chosen.runner), "runs_on": chosen.runner.device,
                      "notes": self._notes(), "drift": chosen.drift.to_json(),
                      "latency": latency, "curve": self.curve, "work": flops,
                      "timing_notes": noise_notes(timings.of("eager") + timings.of(chosen.label)) + self._budget_notes(),
                      "verdict": chosen.verdict.to_json()}
        names = tuple(o[0] for o in chosen.outputs)
        origin = source_info(loaded.source, loaded.format, loaded.module if loaded.source is None else None)
        if loaded.hub is not None:
            origin["hub"] = loaded.hub.to_json()
        if loaded.task is not None:
            origin["task"] = {"name": loaded.task.name, "judged_by": loaded.task.judged_by}
        samples = sum(int(next(iter(b.values())).shape[0]) if spec.batch_symbol else 1 for b in batches)
        record = provenance.record(ctx.command, ctx.call, recipe.name, ctx.calib,
                                   {"source": self.source, "samples": samples, "sha256": data_sha256(batches)},
                                   ctx.settings)
        with staged_output(ctx.out, ctx.force) as stage:
            validation["stored_samples"] = store_samples(stage / "validation" / "samples.npz", batches, self.ref_out,
                                                         names, spec.batch_symbol is not None)
            manifest = base_manifest(ctx.name, origin, target, recipe, spec, chosen.outputs, final.lineage, validation,
                                     candidates=cand.table(candidates, timings, ctx.batch_mix), selection=self.why,
                                     provenance=record, shipped=shipped_precision(final.lineage))
            manifest = write_output(stage, manifest, final.path, spec, target.device, recipe.emit, final.attachments,
                                    server_engine=server_engine(final.lineage), products=final.products,
                                    times=ctx.times)
        return BuildResult(ctx.name, ctx.out, manifest, final, candidates)

    def _notes(self) -> list[str]:
        """The report's notes on what the build did: the passes', the timing's dropped runners, the probe, the range
        ends, the thread cap, the devices."""
        chosen, candidates, target, eager = self.chosen, self.candidates, self.request.target, self.eager
        notes = pass_notes(chosen.artifact.lineage) + [f"{name}: {why}" for name, why in self.timings.dropped.items()]
        probed = [c for c in candidates if c.probe_share is not None]
        if probed and not any(c.reason.startswith("not built: ") for c in candidates):
            notes.append(f"{probed[0].label} computed at {probed[0].probe_share:.0%} of this machine's measured fp32 "
                         f"matmul peak on the first validation batch, under the {cand.ROOF_SHARE:.0%} at which the "
                         "candidates after it are skipped, so they were built")
        if self.ends:
            notes.append("ran at the ends of its dim ranges (" + "; ".join(where for where, _, _ in self.ends)
                         + ") with the output shapes eager gives")
        if cap := thread_cap():
            notes.append(f"{THREADS_ENV}={cap}: every run here used at most that many threads; latency is for them")
        if eager.device == "cuda":
            notes.append("eager: the source model in its own precision on the GPU; every GPU time is from CUDA events")
        if getattr(chosen.runner, "graphs", None) is not None:
            notes.append(f"{chosen.label}: {chosen.runner.graphs.describe()}")
        if target.device != "cpu" and chosen.runner.device == "cpu":
            notes.append(f"target {target.name} is a {target.device} device; drift and latency were measured here on "
                         f"{cand.runner_description(chosen.runner)}, not on the target")
        return notes

    def _budget_notes(self) -> list[str]:
        """What the timing budget cut: shorter rows, batch sizes left out of the curve, warm-ups skipped."""
        notes, row_s, lat_cfg, untimed = [], self.row_s, self.lat_cfg, self.untimed
        if row_s < lat_cfg.seconds or untimed:
            notes.append(f"timed within a budget of {self.clock.describe()}: {row_s:.1f} s per latency row, each at "
                         f"least {MIN_LATENCY_RUNS} runs however long they lasted ({MIN_TRIAL_RUNS}, one ABBA trial, "
                         f"where {MIN_LATENCY_RUNS} would take over twice the row's time; 1, a single pair, where "
                         f"{MIN_TRIAL_RUNS} would)" + (
                             f"; the curve left out batch {', '.join(map(str, untimed))}: its predicted time did not "
                             "fit what the latency step left" if untimed else ""))
        if slow_warm := [b for b, run_s in self.warmed.items() if run_s >= timing.WARMUP_S]:
            notes.append(f"batch {', '.join(map(str, slow_warm))} timed without warm-up runs: the validation had just "
                         "run every runner there at the same shapes")
        return notes

    def _status_stopped(self) -> None:
        status, self.status = self.status, None
        if status:
            status.stop()


def _with_measured_roof(target):
    """The target, with this machine's measured bandwidth and fp32 peak when it is this machine (a
    CPU target) and declares neither."""
    if target.device != "cpu" or target.memory_bandwidth_gbs is not None or target.peak_tflops:
        return target
    bandwidth, peak, how = machine.measured_roof()
    return target.model_copy(update={"memory_bandwidth_gbs": round(bandwidth, 1), "peak_tflops": {"fp32": round(peak, 4)},
                                     "measured": how})


def _plan(loaded, request: BuildRequest) -> dict[str, Any]:
    """What a build with these settings would do, resolved without building: the dry run's answer.
    An output the build would refuse (there without --force, or not infopt's) is refused the same way."""
    spec, recipes, target, name, out = request.spec, request.recipes, request.target, request.name, request.out
    val, calibration, budget = request.val, request.calibration, request.budget
    check_output(out, request.force)
    kind = loaded.with_spec(spec).kind
    python_module = loaded.artifact.has_python_module
    candidates = []
    for r in recipes:
        reason = cand.blocked_reason(r, target, kind, python_module)
        candidates.append({"recipe": r.name, "backend": r.backend, "precision": r.precision,
                           "passes": [step.name for step in r.passes], "skipped": reason})
    return {
        "dry_run": True, "name": name, "output": str(out), "replaces_existing": out.exists(),
        "source": str(loaded.hub.repo_id if loaded.hub else loaded.source or "(in-memory module)"),
        "format": loaded.format, "target": target.name, "inputs": spec.to_json(),
        "validation_data": str(val) if val is not None else "random inputs (no --val)",
        "calibration": None if calibration is None else str(calibration),
        "budget": None if budget is None else str(budget),
        "candidates": candidates,
    }


def _batch_mix(mix: dict[int, float] | None, batch_sizes) -> dict[int, float] | None:
    """The declared share of requests per batch size, scaled to sum to 1 (None when not declared)."""
    if not mix:
        return None
    fix = "pass the sizes and shares the model serves, e.g. --batch-mix 1:0.7,32:0.3 (batch_mix={1: 0.7, 32: 0.3})"
    try:
        pairs = {int(b): float(w) for b, w in dict(mix).items()}
    except (TypeError, ValueError):
        raise UsageError(f"batch mix {mix!r} is not batch size -> share", fix=fix) from None
    if not pairs or any(b < 1 or not math.isfinite(w) or w <= 0 for b, w in pairs.items()):
        raise UsageError(f"batch mix {mix!r}: every batch size >= 1 and every share above 0", fix=fix)
    if batch_sizes and sorted(set(batch_sizes)) != sorted(pairs):
        raise UsageError(f"--batch-mix names batch sizes {sorted(pairs)} and --batch-sizes {list(batch_sizes)}",
                         fix="the mix's sizes are the ones timed: drop --batch-sizes, or give the same sizes")
    total = sum(pairs.values())
    return {b: w / total for b, w in sorted(pairs.items())}


@dataclass
class BuildRequest:
    """One build as asked and resolved before any slow work: what to build (the input spec, the candidate
    recipes, the target), where it goes, the data it is judged and calibrated on, and what the build records
    besides the model (how it was asked for, the budget, seconds per step). The steps of a build read it."""

    spec: InputSpec
    recipes: list[Recipe]
    target: Any
    name: str
    out: Path
    """the output folder, absolute"""
    command: Sequence[str] | None
    """the command line that asked for the build (the CLI's), or None for a Python call"""
    call: str
    """the build as a Python call, recorded when there is no command line"""
    force: bool = False
    val: Any = None
    max_samples: int = DEFAULT_MAX_VAL_SAMPLES
    console: Any = None
    calibration: Any = None
    """calibration data as given (a path, an iterable, ...); :attr:`calib` once loaded"""
    calib_samples: int | None = 128
    calib_seed: int = 0
    tokenizer: str | None = None
    budget: Any = None
    allow_partial: bool = False
    batch_mix: dict[int, float] | None = None
    """the declared share of requests per batch size, which weighs each size when candidates are compared"""
    calib: Any = None
    reader: Any = None
    """turns raw --val and --calib files into samples (see :func:`raw_reader`)"""
    times: StepTimes = field(default_factory=StepTimes)
    """seconds per step, for the manifest's ``timings``"""
    settings: Settings = field(default_factory=dict)
    """what the build was asked for that passes take (the flags), given to every pass's pipeline"""


def _work(module, spec, model_file: Path) -> dict[str, Any]:
    """FLOPs and bytes per sample, for the report's roofline line."""
    weight_bytes = model_bytes(model_file)
    dims = {spec.batch_symbol: 1} if spec.batch_symbol else {}
    feed = random_feed(spec, int_high=id_high(module), **dims)
    return count_work(module, feed, spec.names, weight_bytes)


def _build_candidates(work, artifact, recipes, target, console, calib, budget, check_batches, check_source,
                      allow_partial=False, times=None, check_reference=None, settings=None, module=None):
    """Run each recipe's pipeline. One this machine cannot build is recorded as skipped; one that
    fails stops the build with every failure named, unless ``allow_partial`` keeps the survivors. Once one
    is built, the rest are skipped where it already computes at this machine's matmul peak
    (:func:`candidates.roof_probe`)."""

    candidates = [cand.Candidate(r) for r in recipes]
    for c in candidates:
        reason = cand.blocked_reason(c.recipe, target, artifact.kind, artifact.has_python_module)
        if reason:
            c.status, c.reason = "skipped", reason
    runnable = [c for c in candidates if c.status != "skipped"]
    if not runnable:
        listing = "; ".join(f"{c.label}: {c.reason}" for c in candidates)
        if all(cand.SOURCE_REASON in c.reason for c in candidates):
            raise UsageError(f"this source cannot be built so: {listing}",
                             fix="use --backend onnxruntime, or build from the Python module (a state dict with "
                                 "--model-class, or a Hugging Face folder)")
        raise EnvironmentProblem(f"nothing can be built here for {target.name}: {listing}",
                                 fix="build on a machine that has what is missing, or choose another --backend or precision")
    errors = []
    shared = SharedPrefixes([c.recipe for c in runnable])
    probed, started = False, time.perf_counter()
    for c in runnable:
        if not probed and any(o.status == "built" for o in runnable):
            probed = True
            first = next(o for o in runnable if o.status == "built")
            try:
                reason = cand.roof_probe(first, check_batches[0], artifact.spec, module, target,
                                         cand.build_seconds(first, time.perf_counter() - started)) if check_batches else None
            except RunnerCrashed as exc:
                first.status, first.reason, reason = "failed", cand.crash_reason(exc), None
            if reason:
                for o in runnable[runnable.index(c):]:
                    o.status, o.reason = "skipped", reason.format(recipe=o.label)
                break
        (work / c.label).mkdir(parents=True, exist_ok=True)
        try:
            c.artifact = Pipeline(c.recipe, target, work / c.label, calibration=calib, budget=budget,
                                  check_batches=check_batches, check_source=check_source,
                                  check_reference=check_reference, console=console,
                                  label=c.label if len(runnable) > 1 else "", times=times,
                                  settings=settings).run(artifact, shared)
            c.runner = cand.validation_runner(c.artifact, target)
            c.outputs = cand.artifact_outputs(c.artifact)
            c.status = "built"
        except (BuildError, EnvironmentProblem) as exc:
            if len(runnable) == 1:
                raise
            errors.append(exc)
            c.status, c.reason = "failed", (cand.crash_reason(exc) if isinstance(exc, RunnerCrashed)
                                            else str(exc).strip().splitlines()[0])
    worker.discard_spares()
    if not any(c.status == "built" for c in candidates):
        raise errors[0]
    cand.survivors(candidates, allow_partial, target.device)
    cand.drop_duplicates(candidates)
    return candidates

