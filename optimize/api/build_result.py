"""What ``infopt.build`` returns, and ``infopt.load``, which opens an output folder's model (both builds, the
candidates' and the text-generation one, return a :class:`BuildResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infopt.api.provenance import check_sealed
from infopt.core.errors import ValidationFailed
from infopt.core.manifest import read_manifest
from infopt.core.manifest_schema import LatencyRow, Manifest
from infopt.runtime.backends import manifest_runner


@dataclass
class BuildResult:
    """What a build made: the chosen artifact, its validation and where it was written."""

    name: str
    output_dir: Path
    manifest: Manifest
    """``manifest.json``, typed (``manifest.to_json()`` is the file's content)"""
    artifact: Any
    candidates: list[Any] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.manifest.validation.verdict.passed

    @property
    def drift(self) -> dict[str, Any]:
        return self.manifest.validation.drift

    @property
    def latency(self) -> list[LatencyRow]:
        return self.manifest.validation.latency

    def load(self, *, threads: int = 0, cuda_graphs: bool | None = None, isolated: bool = False):
        return load(self.output_dir, allow_failed=True, threads=threads, cuda_graphs=cuda_graphs, isolated=isolated)



def load(dist_dir: str | Path, *, allow_failed: bool = False, threads: int = 0, key: str | Path | None = None,
         cuda_graphs: bool | None = None, isolated: bool = False):
    """A callable runner for an output folder's model; refuses one whose validation failed, and one
    whose files differ from its manifest (or, with ``key``, whose manifest's signature does not verify).
    ``threads`` sets ONNX Runtime's intra-op threads (0: its default, one per core). ``cuda_graphs``:
    a CUDA AOTInductor package replays CUDA graphs per batch bucket unless False (None: on for CUDA).
    ``isolated``: run it in a worker process where its backend's native code can crash (AOTInductor, TensorRT,
    GPU execution providers; ``runtime/worker.py``), so a crash raises ``RunnerCrashed`` here instead of ending
    this process; every call then crosses a pipe (about 80 us here). Builds, ``validate`` and ``gate`` do so."""

    root = Path(dist_dir)
    manifest = read_manifest(root)
    check_sealed(root, manifest, "output", key)
    if not manifest.validation.verdict.passed and not allow_failed:
        raise ValidationFailed(f"{root} failed validation: {'; '.join(manifest.validation.verdict.reasons)}",
                               fix="rebuild it, or pass allow_failed=True to load it anyway")
    return manifest_runner(root, manifest, threads, cuda_graphs=cuda_graphs, fenced=isolated)
