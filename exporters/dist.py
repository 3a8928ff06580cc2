"""The output folder: staged in a temporary sibling and renamed into place at the end.

A failed or interrupted build leaves no half-written ``dist/<name>``; an existing one is replaced
only with ``force``. Every file is listed in the manifest with its sha256.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from infopt.errors import OutputExistsError, UsageError

MANIFEST = "manifest.json"


def check_output(out: Path, force: bool) -> None:
    """Fail early, before any work, if the output cannot be written."""
    if out.exists() and not force:
        raise OutputExistsError(f"output folder {out} already exists",
                                fix="pass --force to replace it, or choose another --output")
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} exists and is not a folder", fix="choose another --output")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise UsageError(f"cannot write the output folder {out}: {exc.strerror or exc}",
                         where=str(parent), fix="choose an --output in a folder you can write to") from exc


@contextmanager
def staged_output(out: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces ``out``, on failure it is removed."""
    out = Path(out)
    check_output(out, force)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield stage
        if out.exists():
            if not force:
                raise OutputExistsError(f"output folder {out} appeared during the build", fix="pass --force to replace it")
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(stage, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def _hash_into(digest, path: Path) -> None:
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    _hash_into(digest, path)
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


def file_table(root: Path, skip: tuple[str, ...] = (MANIFEST,)) -> dict[str, dict[str, Any]]:
    """Every file under ``root`` (but the manifest) with its size and sha256."""
    table = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel not in skip:
            table[rel] = {"bytes": path.stat().st_size, "sha256": sha256(path)}
    return table


def jsonable(value: Any) -> Any:
    """Non-finite floats as strings ("inf", "-inf", "nan"), so the manifest is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    (root / MANIFEST).write_text(json.dumps(jsonable(manifest), indent=2, allow_nan=False) + "\n")


def read_manifest(root: Path) -> dict[str, Any]:
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise UsageError(f"{root} has no {MANIFEST}: it is not an infopt output folder",
                         fix="pass the folder `infopt build` wrote (dist/<name>)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}", fix="rebuild the artifact") from exc


def output_root(path: Path) -> Path:
    """The output folder named by ``path``: the folder itself, or the folder of its manifest.json."""
    path = Path(path)
    return path.parent if path.name == MANIFEST else path


FILE_PROBLEMS = {"missing": "missing", "changed": "sha256 differs from the manifest",
                 "unrecorded": "the manifest records no sha256 for it"}


def file_status(root: Path, rel: str, info: Any) -> str:
    """``ok``, ``missing``, ``changed`` (size or sha256 differs) or ``unrecorded`` (no sha256 in the manifest)."""
    if not isinstance(info, dict) or not info.get("sha256"):
        return "unrecorded"
    path = Path(root) / rel
    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size != info.get("bytes", size) or sha256(path) != info["sha256"]:
        return "changed"
    return "ok"


def verify_files(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Listed files that are missing or differ from the manifest."""
    problems = []
    for rel, info in manifest.get("files", {}).items():
        status = file_status(root, rel, info)
        if status != "ok":
            problems.append(f"{rel}: {FILE_PROBLEMS[status]}")
    return problems
