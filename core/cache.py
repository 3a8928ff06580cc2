"""infopt's cache folder: ``$INFOPT_CACHE_DIR`` (default ``~/.cache/infopt``), one subfolder per use.

Calibration tables, Inductor's compiled kernels, TensorRT timing caches, ONNX exports and the
measured roof of the build machine all live here, so a user can see, size and clear everything
infopt keeps between builds in one place.

``stored`` and ``store`` are a content-keyed store of files: an entry is named by the hash of
everything its files depend on (``content_key``), is written whole or not at all, and is checked
against the sha256 of its files when read; the least recently used go beyond ``STORE_MAX_BYTES``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from infopt.core.file_hash import sha256


def cache_root() -> Path:
    return Path(os.environ.get("INFOPT_CACHE_DIR") or Path.home() / ".cache" / "infopt")


_FALLBACK_SAID: set[str] = set()


def _fallback_root() -> Path:
    return Path(tempfile.gettempdir()) / f"infopt-cache-{os.getuid()}"


def cache_dir(name: str) -> Path:
    """``<cache root>/<name>``, created if missing. Where the cache root cannot be written (a read-only or missing
    home, ``INFOPT_CACHE_DIR`` naming a file), the build goes on with ``$TMPDIR/infopt-cache-<uid>`` instead and
    says so once on stderr: a cache saves time, and no build should fail for the lack of one."""
    folder, problem = _made(name)
    if problem is not None and str(cache_root()) not in _FALLBACK_SAID:
        _FALLBACK_SAID.add(str(cache_root()))
        sys.stderr.write(f"warning: infopt's cache folder {cache_root()} cannot be written ({type(problem).__name__}: "
                         f"{problem.strerror or problem}); this process caches in {_fallback_root()} instead (set "
                         "INFOPT_CACHE_DIR to a folder you can write)\n")
    return folder


def _made(name: str) -> tuple[Path, OSError | None]:
    """(``<cache root>/<name>``, None), or where the root cannot be written, (the fallback's, why), created."""
    try:
        (cache_root() / name).mkdir(parents=True, exist_ok=True)
        return cache_root() / name, None
    except OSError as exc:
        (_fallback_root() / name).mkdir(parents=True, exist_ok=True)
        return _fallback_root() / name, exc


def point_inductor_at_cache() -> None:
    """Keep Inductor's cache in infopt's (``<cache root>/inductor``) unless ``TORCHINDUCTOR_CACHE_DIR`` is set:
    importing ``torch._inductor`` makes ``$TMPDIR/torchinductor_<user>`` otherwise, a folder left behind by every
    command, even one refused before any work. Where the cache root cannot be written, Inductor's goes where
    :func:`cache_dir` falls back to, without a word yet (it says so when the build first uses its cache)."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return
    try:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_made("inductor")[0])
    except OSError:
        pass  # neither can be written: Inductor's own default, as without infopt


STORE_MAX_BYTES = 4 * 2**30
"""a content-keyed store (``stored``/``store``) drops its least recently used entries beyond this size"""


def content_key(*parts: str | bytes) -> str:
    """sha256 over ``parts``, each length-prefixed, so that no two different sequences share a key."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def stored(kind: str, key: str) -> tuple[Path, dict[str, Any]] | None:
    """(folder, its meta) of the complete entry ``key`` of store ``kind``, with every file's sha256 as
    stored; None when there is none, or it no longer matches (then it is removed)."""
    folder = cache_dir(kind) / key
    try:
        meta = json.loads((folder / META).read_text())
        if any(sha256(folder / rel) != digest for rel, digest in meta["files"].items()):
            raise ValueError("changed")
    except (OSError, ValueError, KeyError, TypeError):
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        return None
    os.utime(folder)  # used: the last to go when the store is pruned
    return folder, meta


def store(kind: str, key: str, files: dict[str, Path], meta: dict[str, Any]) -> None:
    """Keep ``files`` (name in the entry -> path) and ``meta`` as entry ``key`` of store ``kind``. The
    entry is written beside the store and renamed into place whole, so a reader never sees half of one;
    failing to store (a full disk) costs the next build the work, nothing else."""
    root = cache_dir(kind)
    final = root / key
    if final.exists() or sum(f.stat().st_size for f in files.values()) > STORE_MAX_BYTES // 2:
        return  # there already, or so large that keeping it would push out everything else
    staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        digests = {}
        for rel, source in files.items():
            shutil.copyfile(source, staging / rel)
            digests[rel] = sha256(staging / rel)
        (staging / META).write_text(json.dumps({**meta, "files": digests}))
        os.rename(staging, final)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return
    _prune(root, STORE_MAX_BYTES)


META = "entry.json"


def _prune(root: Path, max_bytes: int) -> None:
    entries = []
    for folder in root.iterdir():
        if folder.is_dir() and not folder.name.startswith("."):
            size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
            entries.append((folder.stat().st_mtime, size, folder))
    total = sum(size for _, size, _ in entries)
    for _, size, folder in sorted(entries):
        if total <= max_bytes:
            break
        shutil.rmtree(folder, ignore_errors=True)
        total -= size
