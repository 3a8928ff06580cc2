"""Provenance: what made an artifact, recorded in its manifest, and ``infopt verify`` to check it.

The manifest's ``provenance`` block holds the command line (or the Python call), the recipe's
name, the sha256 of the calibration and validation data as they were fed to the model, and the
toolchain's versions; ``files`` holds the size and sha256 of every file in the output folder but
the manifest itself. ``verify`` re-hashes the folder against it: a changed, missing or added file
is a mismatch.
"""

from __future__ import annotations

import json
import platform
import shlex
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Sequence

from infopt.api.signing import check_signature, write_signature
from infopt.core.errors import IntegrityError
from infopt.core.manifest import FILE_PROBLEMS, MANIFEST, UNLISTED, file_status, read_manifest, sha256
from infopt.core.manifest_schema import Manifest

TOOLCHAIN = ("infopt", "torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu", "numpy", "tensorrt", "triton",
             "torchao", "transformers", "gptqmodel", "torch-model-archiver")
"""Packages whose versions the manifest records (those not installed are recorded as such)."""


def tool_versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in TOOLCHAIN:
        try:
            found[pkg] = version(pkg)
        except PackageNotFoundError:
            if pkg not in ("onnxruntime-gpu", "tensorrt", "gptqmodel"):
                found[pkg] = "not installed"
    try:
        import torch

        found["torch.cuda"] = torch.version.cuda or "none (CPU build)"
    except ImportError:  # pragma: no cover - a core dependency
        pass
    return found


def call_text(model: Any, options: dict[str, Any]) -> str:
    """The Python call that made a build, for a build not started from the command line: the model
    (a path, or the module's class) and every option that differs from its default."""
    what = repr(str(model)) if isinstance(model, (str, Path)) else f"<{type(model).__name__} module>"
    shown = [f"{k}={_short(v)}" for k, v in options.items()]
    return f"infopt.build({', '.join([what, *shown])})"


def _short(value: Any) -> str:
    if isinstance(value, (str, int, float, bool, type(None), Path)):
        return repr(str(value) if isinstance(value, Path) else value)
    if isinstance(value, (list, tuple, dict)) and len(repr(value)) <= 200:
        return repr(value)
    return f"<{type(value).__name__}>"


def record(command: Sequence[str] | None, call: str, recipe_name: str, calibration, validation: dict[str, Any],
           settings=None) -> dict[str, Any]:
    """The manifest's provenance block; ``settings``: the build settings the user gave (``core.pass_api.Settings``), which
    the passes that take them put in their options over the recipe's."""
    return {
        "command": shlex.join(command) if command else None,
        "python_call": None if command else call,
        "recipe": recipe_name,
        "settings": json.loads(json.dumps(dict(settings or {}))),
        "calibration": None if calibration is None else {"source": calibration.source, "samples": calibration.count,
                                                         "sha256": calibration.digest},
        "validation_data": validation,
    }


def check_files(root: Path, manifest: Manifest) -> tuple[list[dict[str, Any]], list[str]]:
    """(a row per file with its status, the problems): every listed file re-hashed, and every file
    on disk that the manifest does not list."""

    listed = manifest.files
    rows, problems = [], []
    for rel, info in listed.items():
        status = file_status(root, rel, info)
        rows.append({"path": rel, "status": status, "bytes": info.bytes, "sha256": info.sha256})
        if status != "ok":
            problems.append(f"{rel}: {FILE_PROBLEMS[status]}")
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel not in UNLISTED and rel not in listed:
            rows.append({"path": rel, "status": "unlisted", "bytes": path.stat().st_size, "sha256": None})
            problems.append(f"{rel}: not in the manifest (added after the build)")
    if not listed:
        problems.append("manifest.json lists no files")
    model = manifest.artifacts.model
    if listed and model not in listed:
        problems.append(f"{model}: the model file is not among the files the manifest lists")
    return rows, problems


def check_sealed(root: Path, manifest: Manifest, label: str, key: str | Path | None = None) -> None:
    """Refuse (exit 2) an output folder whose files differ from its manifest, or, with ``key``,
    whose manifest's signature does not verify: run before any file of it is used."""

    _, problems = check_files(root, manifest)
    if problems:
        raise IntegrityError(f"the {label} {root} does not match its manifest: " + "; ".join(problems),
                             where=str(Path(root) / "manifest.json"),
                             fix=f"rebuild the {label} or restore its files; `infopt verify {root}` lists every file")
    if key is not None:
        check_signature(root, key, label)


def verify(root: Path, key: str | Path | None = None) -> dict[str, Any]:
    """Re-hash an output folder against its manifest. ``problems`` lists every changed, missing or
    unlisted file, and with ``key`` a signature that does not verify; an empty list means the folder
    is exactly what the build wrote (and, signed, what the key's owner signed)."""

    root = Path(root)
    manifest = read_manifest(root)
    rows, problems = check_files(root, manifest)
    signature = None
    if key is not None:
        try:
            record = check_signature(root, key)
            signature = f"valid, Ed25519 key {record['public_key']}"
        except IntegrityError as exc:
            signature = "INVALID"
            problems.append(exc.what)
    provenance = manifest.provenance.model_dump(exclude_unset=True) if manifest.provenance else None
    return {"dist": str(root), "name": manifest.name, "manifest_sha256": sha256(root / MANIFEST),
            "files": rows, "problems": problems, "passed": not problems, "signature": signature,
            "provenance": provenance, "versions": manifest.versions}


def sign(root: str | Path, key: str | Path) -> dict[str, Any]:
    """Sign an output folder (``manifest.json.sig``), only if its files still match its manifest."""
    root = Path(root)
    check_sealed(root, read_manifest(root), "output")
    return write_signature(root, key)
