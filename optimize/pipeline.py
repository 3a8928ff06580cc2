"""Pipeline: runs a recipe's passes in order, timing each and recording its artifact size.

A pass whose input representation is already behind the model (capture, for an ONNX file) is
skipped and recorded as such, unless it is not ``skippable``: then the build stops with a usage
error. A pass that raises stops the build with an error that names it.
"""

from __future__ import annotations

import logging
import re
import time
from contextlib import nullcontext
from pathlib import Path

from rich.markup import escape

from infopt.artifact import STAGE, Artifact, PassRecord
from infopt.errors import BuildError, InfoptError, RecipeError, UsageError
from infopt.recipe import Recipe
from infopt.registry import PassContext, get_pass
from infopt.target import Target

log = logging.getLogger("infopt.pipeline")


class Pipeline:
    def __init__(self, recipe: Recipe, target: Target, workdir: Path, *, calibration=None, budget=None,
                 check_batches=None, console=None, label: str = ""):
        self.recipe = recipe
        self.target = target
        self.workdir = workdir
        self.calibration = calibration
        self.budget = budget
        self.check_batches = check_batches
        self.console = console
        self.label = f"{label}: " if label else ""
        self._say = None

    def run(self, artifact: Artifact) -> Artifact:
        steps = [(get_pass(s.name), s.options) for s in self.recipe.passes]
        artifact = artifact.derive(artifact.kind, path=artifact.path, obj=artifact.obj)  # the caller's lineage stays its own
        progress = _progress(self.console)
        with progress or nullcontext():
            task = progress.add_task("building", total=len(steps)) if progress else None
            for definition, raw_options in steps:
                if progress:
                    head = f"{escape(self.label)}pass [bold]{definition.name}[/]"
                    progress.update(task, description=head)
                    self._say = lambda text, h=head: progress.update(task, description=f"{h}: {escape(text)}")
                artifact = self._run_one(definition, raw_options, artifact)
                if progress:
                    progress.advance(task)
        return artifact

    def _run_one(self, definition, raw_options, artifact: Artifact) -> Artifact:
        record = PassRecord(definition.name, definition.consumes, definition.produces)
        if STAGE[definition.consumes] < STAGE[artifact.kind]:
            if not definition.skippable:
                needs = "the model's Python module" if definition.consumes == "torch" else f"the model as {definition.consumes}"
                raise UsageError(f"pass {definition.name} needs {needs}, and this model is already {artifact.kind}",
                                 where=f"recipe {self.recipe.name}",
                                 fix="pass the model it was made from (a Hugging Face folder, a state dict with "
                                     "--model-class, or an nn.Module)" if definition.consumes == "torch" else None)
            record.skipped = True
            record.notes.append(f"skipped: the model is already {artifact.kind}")
            record.details = {"options": definition.parse_options(raw_options).model_dump()}
            artifact.lineage.append(record)
            return artifact
        if definition.consumes != artifact.kind:
            raise RecipeError(
                f"pass {definition.name} consumes {definition.consumes} but the model is {artifact.kind}",
                where=f"recipe {self.recipe.name}",
            )
        if definition.needs_calibration and self.calibration is None:
            raise RecipeError(f"pass {definition.name} needs calibration data", fix="pass --calib PATH")
        options = definition.parse_options(raw_options)
        context = PassContext(self.target, self.workdir, self.calibration, self.budget, self.check_batches, self._say)
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
            raise BuildError(
                f"pass {definition.name} failed: {type(exc).__name__}: {_first_line(exc)}",
                where=f"pass {definition.name} ({definition.consumes} -> {definition.produces})",
                fix="run `infopt --verbose build ...` for the full trace; try --recipe with this pass removed "
                    "to see whether the rest of the pipeline works",
            ) from exc
        record.seconds = time.perf_counter() - start
        record.changed = outcome.changed
        record.notes.extend(outcome.notes)
        record.details = outcome.details
        result = outcome.artifact
        record.size_bytes = result.size_bytes()
        result.lineage = list(artifact.lineage) + [record]
        log.info("pass %s: %.2fs changed=%s", definition.name, record.seconds, record.changed)
        return result


def _first_line(exc: Exception) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0][:400] if text else "(no message)"


def _progress(console):
    if console is None:
        return None
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                    console=console, transient=True)
