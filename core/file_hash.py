"""A file's sha256, read a MiB at a time: light to import (the cache, which the CLI imports first, needs it, and
the manifest's schema takes 0.3 s to import)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def hash_into(digest, path: Path) -> None:
    """Feed the file at ``path`` into ``digest`` (a ``hashlib`` object)."""
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    hash_into(digest, path)
    return digest.hexdigest()
