"""``infopt.build``: every build, whatever its task, as one sequence of named stages.

1. **settle**: the keywords become one ``BuildConfig``, and the task is chosen (``task_choice``): a Hugging Face
   causal LM builds ``text-generation`` where that builds what was asked, everything else ``logits``.
2. **plan**: the task's recipes, checked against the target and the settings, and the output folder checked, before
   the model loads.
3. **load**: the model, and what follows from it: its inputs, its name, the output folder.
4. **dry run**: with ``dry_run``, the plan is returned and nothing is written.
5. **prepare**: what the build measures before it claims the output (the machine's roof).
6. **workspace**: with the output folder claimed, the flow's work folder opened (and what else its stages share);
   the stages below run inside it.
7. **reference**: the source model's answers that the artifact is judged against.
8. **pipeline**: the task's recipes run by the pass pipeline: the candidates, or the decoder's folder.
9. **judge**: each artifact's outputs against the reference's, each against its budgets.
10. **time**: each artifact timed; a logits build chooses its best candidate from the verdicts and times.
11. **emit**: the output folder staged (the model, the manifest, the reports, the servers' packages) and renamed
    into place.

Each task is a flow that supplies these stages: :class:`~infopt.api.logits_flow.LogitsFlow` (candidates judged for
drift against the eager model) and :class:`~infopt.api.generation_flow.GenerationFlow` (the decoder's ONNX Runtime
GenAI folder, judged by generating from it).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, Sequence

from infopt.api import task_choice
from infopt.api.build_config import BuildConfig, flag_of
from infopt.api.build_result import BuildResult, load  # noqa: F401 - load: infopt.load
from infopt.api.generation_flow import GenerationFlow
from infopt.api.logits_flow import LogitsFlow
from infopt.core.errors import UsageError
from infopt.core.memory import older_objects_frozen
from infopt.core.step_times import StepTimes
from infopt.exporters.staging import claim_output


class Flow(Protocol):
    """What a task supplies to the stages of a build; a flow holds its build's state between them."""

    task: str
    times: StepTimes
    out: Any
    """the output folder, absolute, once loaded"""
    force: bool

    def plan(self) -> None:
        """The recipes resolved and checked, the output folder checked: every refusal before the model loads."""

    def load(self) -> None:
        """The model loaded, and what follows from it: the inputs, the name, :attr:`out`."""

    def dry_run(self) -> dict[str, Any]:
        """What the build would do, resolved; nothing written."""

    def prepare(self) -> None:
        """What the build measures before it claims the output folder."""

    def workspace(self) -> AbstractContextManager[None]:
        """The work folder, and what else the stages below share while they run (the judging's process)."""

    def reference(self) -> None:
        """The source model's answers that the artifact is judged against."""

    def run_pipeline(self) -> None:
        """The task's recipes run by the pass pipeline."""

    def judge(self) -> None:
        """Each artifact's outputs against the reference's."""

    def time(self) -> None:
        """Each artifact timed (and for a logits build, the best candidate chosen)."""

    def emit(self) -> BuildResult:
        """The output folder written: staged, then renamed into place."""


def _console(progress: bool | Any):
    if progress is False or progress is None:
        return None
    if progress is True:
        from rich.console import Console

        return Console(stderr=True)
    return progress


@older_objects_frozen()
def build(model: Any, example_inputs: Any = None, config: BuildConfig | None = None, *, progress: bool | Any = True,
          command: Sequence[str] | None = None, **settings: Any) -> BuildResult | dict[str, Any]:
    """Build, validate and emit a deployable artifact.

    ``model`` is a path (TorchScript, ``.pt2``, state_dict with ``model_class``, ONNX, or a pickled
    module with ``allow_pickle``), a Hugging Face folder or hub id, or an ``nn.Module``. ``example_inputs``
    (a tensor or a tuple of them) give the input spec of a module.

    ``config`` (a :class:`~infopt.api.build_config.BuildConfig`) holds every setting; each keyword in
    ``settings`` sets the field of its name over it (``precision="int8"``, ``val="val.npz"``,
    ``output="dist/m"``), validated as that field, and a keyword that names no field is a ``UsageError``.
    ``docs/guide/python-api.md`` lists the settings. ``progress``: True for a progress display on stderr, False for
    none, or a ``rich`` console. ``command`` is the command line that asked for the build (the CLI passes it); the
    manifest records it, or else the Python call.

    The output goes to ``output`` (default ``dist/<name>``), written to a temporary sibling and renamed into place
    at the end. When one of several candidates fails to build or to run, the others are judged, the best that
    passes ships and the failures are listed; ``strict=True`` stops the build instead (``BuildError``). INT8 on a
    CPU target ships FP32 when no INT8 graph is faster here, unless ``require_precision``. ``dry_run=True``
    resolves everything a build would (target, candidates and their passes, inputs, output folder), writes
    nothing, and returns that plan.

    ``task="text-generation"`` builds a Hugging Face causal LM as its decoder with the KV cache, an ONNX Runtime
    GenAI folder judged by generating from it. ``task="logits"`` builds one graph from the inputs to the head's
    output. Without ``task``, a causal LM builds text-generation wherever that builds what was asked, and
    everything else logits; a causal LM kept on logits says why on the progress console.
    """
    config = BuildConfig.of(config, **settings)
    return run(_settle(model, example_inputs, config, _console(progress), command), config.emit.dry_run)


@older_objects_frozen()
def build_generation(model: str | Path, config: BuildConfig | None = None, *, command: list[str] | None = None,
                     console: Any = None, **settings: Any) -> BuildResult | dict[str, Any]:
    """:func:`build` of a causal LM's text-generation folder, the task not chosen but given (the command line's
    ``--task text-generation``): its own messages name the flags it refuses. ``console``: a ``rich`` console for
    progress, or None."""
    config = BuildConfig.of(config, **settings)
    return run(GenerationFlow(model, config, console, command), config.emit.dry_run)


def run(flow: Flow, dry_run: bool = False) -> BuildResult | dict[str, Any]:
    """The stages after the first, in order, on ``flow``."""
    flow.plan()
    flow.load()
    if dry_run:
        return flow.dry_run()
    flow.prepare()
    with claim_output(flow.out, flow.force), flow.workspace():
        flow.reference()
        flow.run_pipeline()
        flow.judge()
        flow.time()
        return flow.emit()


def _settle(model: Any, example_inputs: Any, config: BuildConfig, console: Any, command: Sequence[str] | None) -> Flow:
    """The flow of the task the build builds (``task_choice``), with its configuration."""
    say = (lambda text: console.print(text, markup=False, soft_wrap=True)) if console is not None else (lambda text: None)
    command = list(command) if command else None
    generation = task_choice.generation_config(model, config, example_inputs, say)
    if generation is not None:
        return GenerationFlow(model, generation, console, command)
    extra = config.generation_only_given()
    if extra:
        raise UsageError(f"{', '.join(flag_of(key) for key in extra)} only a text-generation build takes; this build is "
                         "--task logits", fix="drop it, or build a causal LM with --task text-generation")
    return LogitsFlow(model, example_inputs, config, console, command)
