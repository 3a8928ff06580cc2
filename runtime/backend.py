"""One descriptor per backend: what it ships, how it runs, and whether this machine can build it;
the servers say which representations they serve (``exporters/servers/emitter.py``). Everything
that once switched on a backend's name or a model file's suffix asks the descriptor instead.

A backend registers itself from its module in ``runtime/backends/`` (found there by name, so a new
backend is one new module there plus the pass that produces its representation).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Sequence

from infopt.core.errors import UsageError
from infopt.core.registry import Registry
from infopt.runtime.runner import Runner
from infopt.runtime.worker import WorkerRunner


def _always(precision: str, device: str) -> str | None:
    return None


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check(component: str, ok: bool, detail: str, fix: str = "") -> dict[str, Any]:
    """One row of ``infopt doctor``: the fix is shown only when the component is missing."""
    return {"component": component, "ok": ok, "detail": detail, "fix": "" if ok else fix}


@dataclass(frozen=True)
class Backend:
    name: str
    """as recipes and targets name it: ``--backend NAME``"""
    representation: str
    """the artifact kind it ships (``core/artifact.py``'s STAGE): onnx, aoti, tensorrt"""
    suffix: str
    """the shipped model file's suffix: ``model/model<suffix>``"""
    runner_kind: str
    """``Runner.kind`` of its runner"""
    open_runner: Callable[..., Runner]
    """``open_runner(path, input_names, output_names, threads=0, device=...)``, and ``cuda_graphs=``
    when ``graphs``"""
    unavailable: Callable[[str, str], str | None] = _always
    """``unavailable(precision, device)``: why this machine cannot build it, or None"""
    describe: Callable[[Runner], str] = lambda runner: f"{runner.device} ({runner.kind})"
    """where a runner of it ran, for the candidates table"""
    graphs: bool = False
    """its runner replays CUDA graphs per batch bucket on a GPU (``runtime/cuda_graphs.py``);
    ``cuda_graphs=None`` lets it choose, True or False says"""
    checks: Callable[[], list[dict[str, Any]]] = lambda: []
    """``infopt doctor``'s rows for what it needs on this machine (``check(...)`` each)"""
    fenced: Callable[[str], bool] = lambda device: False
    """``fenced(device)``: whether a build, ``validate`` and ``gate`` run its runner on ``device`` in a worker
    process (``runtime/worker.py``), because its native code can crash the process that runs it"""
    worker_imports: tuple[str, ...] = ()
    """the modules a worker imports for it as soon as it starts, while the build does other work
    (``worker.prestart``)"""


BACKENDS: Registry[Backend] = Registry("backend", lambda b: b.name)
register = BACKENDS.register
registered = BACKENDS.all
named = BACKENDS.named


def for_file(path: str | Path) -> Backend:
    suffix = Path(path).suffix
    for backend in BACKENDS.items.values():
        if backend.suffix == suffix:
            return backend
    raise UsageError(f"{path} is not a model file any backend runs",
                     fix=f"expected one of: {', '.join(b.suffix for b in BACKENDS.items.values())}")


def for_runner(runner: Runner) -> Backend | None:
    return next((b for b in BACKENDS.items.values() if b.runner_kind == runner.kind), None)


def runner_for_file(path: str | Path, input_names: Sequence[str] = (), output_names: Sequence[str] = (),
                    threads: int = 0, device: str = "cpu", cuda_graphs: bool | None = None,
                    fenced: bool = False) -> Runner:
    """The runner for a model file, by the backend whose suffix it has; ``cuda_graphs`` reaches the
    backends whose runners replay graphs (None: their own choice, which is on for a CUDA model). ``fenced``:
    in a worker process (``runtime/worker.py``) where the backend says its native code needs it on ``device``
    (``Backend.fenced``); in this process otherwise."""
    backend = for_file(path)
    options = {"cuda_graphs": cuda_graphs} if backend.graphs else {}
    if fenced and backend.fenced(device):
        return WorkerRunner(path, input_names, output_names, threads, device, options, opener=backend.open_runner)
    return backend.open_runner(Path(path), input_names, output_names, threads=threads, device=device, **options)
