"""A file's sha256, read a MiB at a time: light to import (the cache, which the CLI imports first, needs it, and
the manifest's schema takes 0.3 s to import).

A build places the same tensors' file in its output more than once (``model/`` and each server's folder), copied by
the kernel or moved. :func:`copy_file` and :func:`move_file` note that the file placed holds the same bytes as its
source, and :func:`origin` names each such group, which the manifest's file table hashes once: a file is known by
its device, inode, size and modification time, so a file written again after its copy is its own group again.
Checking files against a manifest always reads them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

_SAME_AS: dict[tuple, tuple] = {}
"""a placed file's signature -> the signature its source had when it was placed"""
_LOCK = threading.Lock()
_KNOWN: dict[tuple, str] = {}
"""a file's signature -> its sha256, hashed ahead (:func:`hashed_ahead`) while the signature held"""
_HASHER = "import sys; from infopt.core.file_hash import sha256; print(sha256(sys.argv[1]))"
"""a child's program: this module's own :func:`sha256` (the import takes 0.08 s)"""


def hash_into(digest, path: Path) -> None:
    """Feed the file at ``path`` into ``digest`` (a ``hashlib`` object)."""
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    hash_into(digest, path)
    return digest.hexdigest()


def signature(path: Path) -> tuple:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def origin(path: Path) -> tuple:
    """The signature of the first file of the copies ``path`` is the last of (its own where it is no copy)."""
    key = signature(path)
    with _LOCK:
        while key in _SAME_AS:
            key = _SAME_AS[key]
    return key


def copy_file(src: Path, dst: Path) -> Path:
    """``shutil.copyfile``, noting that ``dst`` holds ``src``'s bytes."""
    key = origin(src)
    shutil.copyfile(src, dst)
    with _LOCK:
        _SAME_AS[signature(dst)] = key
    return Path(dst)


def move_file(src: Path, dst: Path) -> Path:
    """``shutil.move`` (a rename on one file system, which keeps the file's signature; a copy between two)."""
    key = origin(src)
    shutil.move(src, dst)
    moved = signature(dst)
    if moved != key:
        with _LOCK:
            _SAME_AS[moved] = key
    return Path(dst)


def known_sha256(key: tuple) -> str | None:
    """The sha256 hashed ahead for the file whose signature (or origin) is ``key``, if any."""
    with _LOCK:
        return _KNOWN.get(key)


@contextmanager
def hashed_ahead(paths: Iterable[Path]) -> Iterator[None]:
    """Hash ``paths`` in child processes while the block runs, for the manifest's file table to take.

    A text-generation build's folder is judged next: ``onnxruntime_genai`` holds the GIL while it opens a model and
    prepacks its weights on one core, so a thread could not hash meanwhile, a process can (2 GB of float32 at
    Qwen2.5-0.5B's shape: 2 s). Leaving the block waits for the hashes (nothing is timed beside them); a digest is
    kept only where the file's signature was the same before and after. Leaving on an error stops them."""
    started = []
    for path in paths:
        before = signature(path)
        child = subprocess.Popen([sys.executable, "-c", _HASHER, str(path)], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        started.append((path, before, child))
    try:
        yield
    except BaseException:
        for _, _, child in started:
            child.kill()
            child.wait()
        raise
    for path, before, child in started:
        digest = child.communicate()[0].strip()
        if child.returncode == 0 and len(digest) == 64 and os.path.exists(path) and signature(path) == before:
            with _LOCK:
                _KNOWN[before] = digest
