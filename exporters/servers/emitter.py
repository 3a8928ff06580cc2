"""One emitter per server: each server's module registers how it writes its layout into an output
folder. ``api/emit.py`` calls the emitters the recipe names (all by default), in ``order``, each for a
backend whose representation it serves.

A new server is one module in ``exporters/servers/`` that registers a ``ServerEmitter`` (the
package finds it by walking the folder), saying which representations it serves and how.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from infopt.core.inputspec import InputSpec
from infopt.core.manifest_schema import Manifest
from infopt.core.registry import Registry
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
    manifest: Manifest
    """the manifest so far (all but ``files``); ``artifacts`` lists what earlier emitters wrote"""
    device: str
    backend: Backend
    server_engine: dict[str, Any] | None = None
    products: Mapping[type, Any] = field(default_factory=dict)
    """in-memory results of the build's passes for an emitter to write, keyed by their type (``Artifact.products``)"""


@dataclass(frozen=True)
class ServerEmitter:
    name: str
    """as recipes' ``emit:`` lists name it, and the folder ``servers/<name>/``"""
    order: int
    """emitters run in this order; one that builds on another's layout (KServe on Triton) comes after it"""
    write: Callable[[EmitJob], Path | None]
    """writes ``servers/<name>/`` and returns the folder (or the file) to list under ``artifacts``;
    None when it has nothing to write for this build"""
    serves: Mapping[str, str]
    """representation (a backend's ``representation``) -> how this server serves it; a backend whose
    representation is not here gets no folder for this server"""

    def serves_backend(self, backend: Backend) -> bool:
        return backend.representation in self.serves


EMITTERS: Registry[ServerEmitter] = Registry("server", lambda e: e.name)
register = EMITTERS.register


def registered() -> list[ServerEmitter]:
    return sorted(EMITTERS.items.values(), key=lambda e: e.order)
