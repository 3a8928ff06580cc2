"""One emitter per server: each server's module registers how it writes its layout into an output
folder. ``api/emit.py`` calls the emitters the recipe names, in ``order``, for a backend whose
descriptor says that server serves it (``runtime/backend.py``'s ``serving``).

A new server is one module in ``exporters/servers/`` that registers a ``ServerEmitter`` (the
package finds it by walking the folder) and a ``serving`` entry in the backends that it serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from infopt.core.inputspec import InputSpec
from infopt.runtime.backend import Backend


@dataclass
class EmitJob:
    """What an emitter is given: the staged output folder and what the build knows."""

    stage: Path
    name: str
    model_file: Path
    """the model as built, beside its external-data sidecar if it has one"""
    staged_model: Path
    """the model as staged: ``stage/model/model<suffix>``"""
    spec: InputSpec
    manifest: dict[str, Any]
    """the manifest so far; ``artifacts`` lists what earlier emitters wrote"""
    device: str
    backend: Backend
    server_engine: dict[str, Any] | None = None


@dataclass(frozen=True)
class ServerEmitter:
    name: str
    """as recipes' ``emit:`` lists name it, and the folder ``servers/<name>/``"""
    order: int
    """emitters run in this order; one that builds on another's layout (KServe on Triton) comes after it"""
    write: Callable[[EmitJob], Path | None]
    """writes ``servers/<name>/`` and returns the folder (or the file) to list under ``artifacts``;
    None when it has nothing to write for this build"""


_EMITTERS: dict[str, ServerEmitter] = {}


def register(emitter: ServerEmitter) -> ServerEmitter:
    if emitter.name in _EMITTERS and _EMITTERS[emitter.name] != emitter:
        raise ValueError(f"server emitter {emitter.name!r} is registered twice")
    _EMITTERS[emitter.name] = emitter
    return emitter


def registered() -> list[ServerEmitter]:
    return sorted(_EMITTERS.values(), key=lambda e: e.order)
