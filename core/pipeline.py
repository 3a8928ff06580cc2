"""Pipeline: runs a recipe's passes in order, timing each and recording its artifact size.

A pass whose input representation is already behind the model (capture, for an ONNX file) is
skipped and recorded as such. A pass that raises stops the build with an error that names it.

Candidates whose recipes begin with the same passes and options (``capture`` ... ``onnx_export``
for ONNX Runtime with and without fusion; ``quantize_int4`` ... for both INT4 backends) share that
work through :class:`SharedPrefixes`: the first builds it, the others start from a copy.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

from pydantic import ValidationError
from rich.markup import escape

from infopt.core import progress as progress_display
from infopt.core.artifact import STAGE, Artifact
from infopt.core.errors import BuildError, DiskFull, InfoptError, RecipeError, disk_full, first_line
from infopt.core.lineage import PassRecord
from infopt.core.memory import release as release_memory
from infopt.core.pass_api import PassContext, PassDetails, Settings, get_pass
from infopt.core.recipe import Recipe
from infopt.core.step_times import StepTimes
from infopt.core.target import Target

log = logging.getLogger("infopt.core.pipeline")


class Pipeline:
    def __init__(self, recipe: Recipe, target: Target, workdir: Path, *, calibration=None, budget=None,
                 check_batches=None, check_source: str = "validation data", check_reference=None, console=None,
                 label: str = "", times: StepTimes | None = None, settings: Settings | None = None,
                 choice=None):
        self.recipe = recipe
        self.target = target
        self.workdir = workdir
        self.calibration = calibration
        self.budget = budget
        self.check_batches = check_batches
        self.check_source = check_source
        self.check_reference = check_reference
        self.choice = choice
        """text held out of calibration for a pass that chooses by accuracy (``PassContext.choice``)"""
        self.console = console
        self.label = f"{label}: " if label else ""
        self.times = times
        """where each pass's seconds are recorded for the build's ``timings`` (None: nowhere)"""
        self.settings = dict(settings or {})
        """what the build was asked for: each pass's options take the settings it declares"""
        self._say = None

    def run(self, artifact: Artifact, shared: "SharedPrefixes | None" = None) -> Artifact:
        steps = [(get_pass(s.name), s.options) for s in self.recipe.passes]
        keys = step_keys(self.recipe)
        artifact = artifact.derive(artifact.kind, path=artifact.path, obj=artifact.obj)  # the caller's lineage stays its own
        done = 0
        if shared is not None:
            done, artifact = shared.start(keys, artifact)
        progress = _progress(self.console)
        with progress or nullcontext():
            task = progress.add_task("building", total=len(steps), completed=done) if progress else None
            for index in range(done, len(steps)):
                definition, raw_options = steps[index]
                if progress:
                    head = f"{escape(self.label)}pass [bold]{definition.name}[/]"
                    progress.update(task, description=head)
                    self._say = lambda text, h=head: progress.update(task, description=f"{h}: {escape(text)}")
                artifact = self._run_one(definition, raw_options, artifact)
                release_memory()  # what the pass let go of (the model it consumed, too), before the next one allocates
                if shared is not None:
                    shared.offer(keys[:index + 1], artifact, self.recipe.name)
                if progress:
                    progress.advance(task)
        return artifact

    def _run_one(self, definition, raw_options, artifact: Artifact) -> Artifact:
        record = PassRecord(definition.name, definition.consumes, definition.produces)
        if STAGE[definition.consumes] < STAGE[artifact.kind]:
            record.skipped = True
            record.notes.append(f"skipped: the model is already {artifact.kind}")
            record.details = {"options": definition.parse_options(raw_options, self.settings).model_dump()}
            artifact.lineage.append(record)
            return artifact
        if definition.consumes != artifact.kind:
            raise RecipeError(
                f"pass {definition.name} consumes {definition.consumes} but the model is {artifact.kind}",
                where=f"recipe {self.recipe.name}",
            )
        options = definition.parse_options(raw_options, self.settings)
        context = PassContext(self.target, self.workdir, self.calibration, self.budget, self.check_batches, self._say,
                              self.check_source, self.check_reference, self.choice, self.settings)
        start = time.perf_counter()
        try:
            outcome = definition.run(artifact, options, context)
        except InfoptError as exc:
            if exc.where is None:
                exc.where = f"pass {definition.name}"
            else:
                exc.where = f"{exc.where} (pass {definition.name})"
            exc.args = (exc.render(),)
            raise
        except Exception as exc:  # a pass failing in a way it did not foresee is still a build error
            log.info("pass %s failed", definition.name, exc_info=True)  # the trace, with --verbose
            if disk_full(exc):
                free = shutil.disk_usage(self.workdir).free
                raise DiskFull(
                    f"pass {definition.name} ran out of disk space: the disk holding the build's work folder "
                    f"{self.workdir} has {free / 1e9:.1f} GB free",
                    where=f"pass {definition.name} ({definition.consumes} -> {definition.produces})",
                    fix="free space on that disk, or set TMPDIR to a folder on a disk with room for about three times "
                        "the model's weights (the work folder holds each pass's result until the build ends)",
                ) from exc
            raise BuildError(
                f"pass {definition.name} failed: {type(exc).__name__}: {first_line(exc)}",
                where=f"pass {definition.name} ({definition.consumes} -> {definition.produces})",
                fix="run `infopt --verbose build ...` for the full trace; try --recipe with this pass removed "
                    "to see whether the rest of the pipeline works",
            ) from exc
        record.seconds = time.perf_counter() - start
        record.changed = outcome.changed
        record.notes.extend(outcome.notes)
        record.details = _checked_details(definition, outcome.details)
        result = outcome.artifact
        record.size_bytes = result.size_bytes()
        result.lineage = list(artifact.lineage) + [record]
        if self.times is not None:
            self.times.add(definition.name, record.seconds, of=self.recipe.name)
        log.info("pass %s: %.2fs changed=%s", definition.name, record.seconds, record.changed)
        return result


def step_keys(recipe: Recipe) -> tuple[str, ...]:
    """Each pass of the recipe with its options, as text that is equal when the pass would do the same work."""
    return tuple(f"{s.name} {json.dumps(s.options, sort_keys=True, default=str)}" for s in recipe.passes)


class SharedPrefixes:
    """The artifacts after the pass prefixes that more than one of ``recipes`` begins with.

    A pass sees only its input artifact, its options and the build's context (the same for every
    candidate), so the same prefix gives the same artifact. Each is kept as a copy, and each
    candidate that starts from it gets its own copy: passes may change an in-memory model in
    place. A model that cannot be copied is not shared; that candidate runs its passes itself."""

    def __init__(self, recipes: list[Recipe]):
        keys = [step_keys(r) for r in recipes]
        self.wanted: set[tuple[str, ...]] = set()
        for i, first in enumerate(keys):
            for other in keys[i + 1:]:
                common = 0
                while common < min(len(first), len(other)) and first[common] == other[common]:
                    common += 1
                if common:
                    self.wanted.add(first[:common])
        self.saved: dict[tuple[str, ...], tuple[Artifact, str]] = {}

    def offer(self, prefix: tuple[str, ...], artifact: Artifact, label: str) -> None:
        if prefix in self.wanted and prefix not in self.saved:
            kept = _copy(artifact)
            if kept is not None:
                self.saved[prefix] = (kept, label)

    def start(self, keys: tuple[str, ...], artifact: Artifact) -> tuple[int, Artifact]:
        """How many of the recipe's passes are already done, and the artifact to go on from."""
        for length in range(len(keys), 0, -1):
            if keys[:length] in self.saved:
                kept, label = self.saved[keys[:length]]
                start = _copy(kept)
                if start is None:
                    break
                for record in start.lineage[-length:]:
                    record.notes.append(f"reused from {label}'s build: the same passes with the same options")
                return length, start
        return 0, artifact


def _copy(artifact: Artifact) -> Artifact | None:
    """The artifact with its own lineage and its own copy of the in-memory model; None when that cannot be copied."""
    try:
        obj = copy.deepcopy(artifact.obj) if artifact.obj is not None else None
    except Exception:  # noqa: BLE001 - what a model cannot copy varies; it is then simply built again
        log.info("not shared: the %s model cannot be copied", artifact.kind, exc_info=True)
        return None
    kept = artifact.derive(artifact.kind, path=artifact.path, obj=obj)
    kept.lineage = copy.deepcopy(artifact.lineage)
    return kept


def _checked_details(definition, details) -> dict:
    """The pass's details as JSON, checked against the type it declares (a mismatch is a bug in the pass)."""
    if isinstance(details, PassDetails):
        details = details.model_dump(mode="json")
    if not details:
        return details
    if definition.details is None:
        raise BuildError(f"pass {definition.name} recorded details but declares no type for them",
                         where=f"pass {definition.name}",
                         fix="give the pass a PassDetails subclass (Pass(..., details=...)) and return an instance of it")
    try:
        return definition.details.model_validate(details).model_dump(mode="json")
    except ValidationError as exc:
        raise BuildError(f"pass {definition.name} recorded details that do not fit {definition.details.__name__}: "
                         f"{first_line(exc)}", where=f"pass {definition.name}") from exc


def _progress(console):
    return progress_display.bar(console)
