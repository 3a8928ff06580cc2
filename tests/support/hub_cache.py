"""A Hugging Face hub cache laid out as ``huggingface_hub`` writes it, made from a local model folder,
so that hub ids are resolved here with no network: ``models--<org>--<name>/blobs/<sha256>``,
``snapshots/<commit>/<file>`` as relative links to the blobs, and ``refs/main`` holding the commit."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COMMIT = "7dbbc90392e2f80f3d3c277d6e90027e55de9125"
"""the commit the cached ``main`` points at (a made-up hash of the right form)"""


def cache_model(cache: Path, repo_id: str, source: Path, commit: str = COMMIT) -> Path:
    """Put the files of ``source`` into ``cache`` as ``repo_id`` at ``commit`` (``refs/main``); the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = path.relative_to(source)
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
