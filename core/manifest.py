"""The output folder's manifest: every file listed with its size and sha256, read back and checked.

How the folder is written (staged, locked, swapped in whole) is ``exporters/staging.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from infopt.core.errors import UsageError
from infopt.core.file_hash import hash_into as _hash_into
from infopt.core.file_hash import known_sha256, origin, sha256
from infopt.core.manifest_schema import FileEntry, Manifest, check_read

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"
UNLISTED = (MANIFEST, SIGNATURE)
"""Files an output folder holds that its manifest does not list: the manifest, and its signature if signed."""


EXTERNAL_DATA_BYTES = 256 * 2**20
"""Past this many bytes of weights, they go to ``model.onnx.data``: one protobuf cannot hold 2 GB, and below
that a model whose tensors lie beside its graph lets every pass that changes only the graph read and write
kilobytes instead of the weights (measured on BERT-large in benchmarks/results/rules.md)."""


def data_sha256(batches: Iterable[dict[str, Any]]) -> str:
    """sha256 over every array's name, dtype, shape and bytes, in order: the data the model saw."""
    digest = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            array = np.ascontiguousarray(batch[name])
            digest.update(f"{name}:{array.dtype}:{array.shape};".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def model_parts(path: Path) -> list[Path]:
    """A model file and its external-data sidecar (``<name>.data``) where there is one."""
    path = Path(path)
    return [part for part in (path, path.with_name(path.name + ".data")) if part.exists()]


def model_bytes(path: Path) -> int:
    return sum(part.stat().st_size for part in model_parts(path))


def model_sha256(path: Path) -> str:
    """sha256 over a model file followed by its sidecar, so two ONNX models with the same graph and
    different weights differ."""
    digest = hashlib.sha256()
    for part in model_parts(path):
        _hash_into(digest, part)
    return digest.hexdigest()


def file_table(root: Path, skip: tuple[str, ...] = UNLISTED) -> dict[str, dict[str, Any]]:
    """Every file under ``root`` (but the manifest) with its size and sha256, the files hashed side by side (hashlib
    and file reads release the GIL): an ONNX model past 256 MB is in the folder three times (the model, Triton's
    copy, TorchServe's archive), 4 GB for BERT-large, hashed in 3.7 s one after the other on 2 cores. The files
    placed as copies of one another are read once (``file_hash.origin``)."""
    files = [(path.relative_to(root).as_posix(), path) for path in sorted(p for p in root.rglob("*") if p.is_file())]
    files = [(rel, path) for rel, path in files if rel not in skip]
    origins = {rel: origin(path) for rel, path in files}
    groups: dict[tuple, Path] = {}  # the files placed as copies of one another (file_hash.copy_file), hashed once
    for rel, path in files:
        groups.setdefault(origins[rel], path)
    digests = {key: digest for key in groups if (digest := known_sha256(key)) is not None}
    todo = {key: path for key, path in groups.items() if key not in digests}
    with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1) or 1) as pool:
        digests.update(zip(todo, pool.map(sha256, todo.values())))
    return {rel: {"bytes": path.stat().st_size, "sha256": digests[origins[rel]]} for rel, path in files}


def write_manifest(root: Path, manifest: Manifest) -> None:
    (root / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2, allow_nan=False) + "\n")


def read_manifest(root: Path) -> Manifest:
    """The manifest of an output folder, checked against its schema (``manifest_schema.py``); every
    path it names must lie inside the folder."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise UsageError(f"{root} has no {MANIFEST}: it is not an infopt output folder",
                         fix="pass the folder `infopt build` wrote (dist/<name>)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}", fix="rebuild the artifact") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        raise UsageError(f"{path} is not an infopt manifest", fix="rebuild the artifact")
    named = [*manifest.get("files", {}), *_strings(manifest.get("artifacts", {}))]
    outside = [rel for rel in named if not _inside(Path(root), rel)]
    if outside:
        raise UsageError(f"{path} names paths outside its output folder: {', '.join(map(repr, outside[:3]))}",
                         where=str(path), fix="rebuild the artifact; a manifest that points outside its folder was edited")
    return check_read(manifest, str(path))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _inside(root: Path, rel: str) -> bool:
    """``rel`` is a relative path that stays inside ``root``, symbolic links followed."""
    if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        return False
    base = root.resolve()
    return (base / rel).resolve().is_relative_to(base)


def output_root(path: Path) -> Path:
    """The output folder named by ``path``: the folder itself, or the folder of its manifest.json."""
    path = Path(path)
    return path.parent if path.name == MANIFEST else path


FILE_PROBLEMS = {"missing": "missing", "changed": "sha256 differs from the manifest",
                 "unrecorded": "the manifest records no sha256 for it"}


def file_status(root: Path, rel: str, info: FileEntry) -> str:
    """``ok``, ``missing``, ``changed`` (size or sha256 differs) or ``unrecorded`` (no sha256 in the manifest)."""
    if not info.sha256:
        return "unrecorded"
    path = Path(root) / rel
    if not path.is_file():
        return "missing"
    if path.stat().st_size != info.bytes or sha256(path) != info.sha256:
        return "changed"
    return "ok"


def verify_files(root: Path, files: Mapping[str, FileEntry]) -> list[str]:
    """Listed files (a manifest's ``files``) that are missing or differ from what it records."""
    problems = []
    for rel, info in files.items():
        status = file_status(root, rel, info)
        if status != "ok":
            problems.append(f"{rel}: {FILE_PROBLEMS[status]}")
    return problems
