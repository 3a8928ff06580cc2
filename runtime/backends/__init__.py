"""Every backend infopt ships to, one module each; importing this package registers them all.

Each module defines its Runner and registers a ``runtime.backend.Backend`` descriptor. Modules are
found by walking this folder, so adding a backend does not touch this file.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from infopt.core.manifest_schema import Manifest
from infopt.runtime.backend import Backend, for_file, for_runner, named, registered, runner_for_file

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["Backend", "for_file", "for_runner", "named", "registered", "runner_for_file", "manifest_runner"]


def manifest_runner(root: Path, manifest: Manifest, threads: int = 0, cuda_graphs: bool | None = None,
                    fenced: bool = False):
    """The runner of an output folder's model, its files already checked against ``manifest``; ``fenced``: in a
    worker process where its backend asks for one (``runner_for_file``)."""
    names = [i.name for i in manifest.inputs.inputs]
    return runner_for_file(root / manifest.artifacts.model, names, list(manifest.output_names), threads,
                           cuda_graphs=cuda_graphs, fenced=fenced)
