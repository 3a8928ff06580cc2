"""Writing an output folder so that nothing is lost: staged, locked, swapped in whole.

- The new output is written into a hidden sibling ``.<name>.tmp-<pid>-<random>`` and moves into
  place only when complete, so ``<name>`` is always either the old output or the new one.
- ``--force`` replaces only a folder infopt wrote (``is_ours``), never a user's own folder.
- An existing output is swapped with the new one in one atomic step (Linux ``renameat2`` with
  ``RENAME_EXCHANGE``); the old one then lies in the temporary sibling and is removed. Where the
  exchange is not available the old folder is first renamed to ``.<name>.old-<pid>-<random>``, and
  a later build puts it back if the process died before the new one moved in.
- One build at a time per output: ``.<name>.lock`` is held (``flock``) for the whole build; a
  second build into the same output fails at once naming the first's pid. The lock dies with its
  process, so every sibling whose lock is free belongs to a build that is gone and is removed
  (``clean_stale``): by the next build into that output, and by ``infopt doctor`` for ``dist/``.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator

from infopt.core.errors import OutputExistsError, UsageError

MAX_NAME_BYTES = 200
"""Longest output folder name: its temporary siblings add up to 30 bytes, and file systems allow 255."""

_STALE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old|probe)-\d+-[A-Za-z0-9_]+$")
_LOCK = re.compile(r"^\.(?P<name>.+)\.lock$")


def is_infopt_output(path: Path) -> bool:
    """Whether ``path`` holds a manifest that infopt wrote (its ``schema`` is ``infopt.manifest/...``)."""
    try:
        manifest = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and str(manifest.get("schema", "")).startswith("infopt.manifest/")


def check_output(out: Path, force: bool, is_ours: Callable[[Path], bool] = is_infopt_output) -> None:
    """Fail early, before any work, if the output cannot or must not be written."""
    out = Path(out).absolute()
    here = Path.cwd().resolve()
    resolved = out.resolve()
    if resolved == here or resolved in here.parents:
        raise UsageError(f"--output {out} is the current folder or one that contains it",
                         fix="name a new folder for the output, e.g. --output dist/model")
    if len(out.name.encode()) > MAX_NAME_BYTES:
        raise UsageError(f"the output folder's name is {len(out.name.encode())} bytes long; at most {MAX_NAME_BYTES} are allowed",
                         where=str(out.parent), fix="pass a shorter --name or --output")
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {out} exists and is not a folder", fix="choose another --output")
    if out.exists() and not force:
        raise OutputExistsError(f"output folder {out} already exists",
                                fix="pass --force to replace it, or choose another --output")
    if out.exists() and any(out.iterdir()) and not is_ours(out):
        raise UsageError(f"{out} is not an infopt output (it has no manifest.json written by infopt), so --force "
                         "will not replace it", fix="choose another --output; move or delete that folder yourself if it may go")
    parent = next(p for p in out.parents if p.exists())  # nothing is created before the build is under way
    try:
        probe = tempfile.mkdtemp(prefix=f".{out.name}.probe-{os.getpid()}-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise UsageError(f"cannot write the output folder {out}: {exc.strerror or exc}",
                         where=str(parent), fix="choose an --output in a folder you can write to") from exc


_PENDING: dict[Path, None] = {}
"""Folders of this process to remove if it is stopped: staged outputs not yet in place, workspaces."""
_HELD: dict[Path, int] = {}
"""This process's output locks (path: fd)."""


@contextmanager
def removed_if_stopped(path: Path) -> Iterator[Path]:
    """Register ``path`` for ``stop_now`` while the block runs."""
    _PENDING[Path(path)] = None
    try:
        yield Path(path)
    finally:
        _PENDING.pop(Path(path), None)


def stop_now() -> None:
    """For a SIGTERM handler that then exits at once: remove what this process staged and release its
    locks, so the output folders are as they were (or as the last completed swap left them)."""
    for path in reversed(list(_PENDING)):
        _remove(path)
    for lock, fd in list(_HELD.items()):
        _release(lock, fd)


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path`` (the file as it is on disk now), or None if another holds it."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed it as we opened it: take the new one


def _release(path: Path, fd: int) -> None:
    _HELD.pop(path, None)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.close(fd)


@contextmanager
def claim_output(out: Path, force: bool, is_ours: Callable[[Path], bool] = is_infopt_output) -> Iterator[Path]:
    """Check ``out`` and hold its lock until the block ends; clean what dead builds left beside it."""
    out = Path(out).absolute()
    check_output(out, force, is_ours)
    created = [p for p in out.parents if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_path(out)
    fd = _try_lock(lock)
    if fd is None:
        owner = _read_pid(lock)
        raise UsageError(f"another infopt build{f' (pid {owner})' if owner else ''} is writing {out}",
                         where=str(lock), fix="wait for it to finish, or build into another --output")
    _HELD[lock] = fd
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        _clean_siblings(out)
        check_output(out, force, is_ours)  # a folder restored from a dead build's .old sibling counts too
        yield out
    except BaseException:
        _release(lock, fd)
        fd = None
        for folder in created:  # the folders made for this output, deepest first, if the build left them empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    finally:
        if fd is not None:
            _release(lock, fd)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _clean_siblings(out: Path) -> list[Path]:
    """With ``out``'s lock held: put back an old output a dead build had moved aside, remove the rest."""
    removed = []
    for path in sorted(out.parent.iterdir()):
        match = _STALE.match(path.name)
        if not match or match["name"] != out.name:
            continue
        if match["kind"] == "old" and not out.exists() and path.is_dir():
            os.replace(path, out)
            continue
        _remove(path)
        removed.append(path)
    return removed


def clean_stale(folder: Path) -> list[Path]:
    """Remove the temporary siblings and lock files that builds which are gone left in ``folder``
    (those whose output's lock is free)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    names = {m["name"] for p in folder.iterdir() for m in (_STALE.match(p.name), _LOCK.match(p.name)) if m}
    for name in sorted(names):
        out = folder / name
        fd = _try_lock(_lock_path(out))
        if fd is None:
            continue  # a live build owns them
        try:
            removed += _clean_siblings(out)
        finally:
            _release(_lock_path(out), fd)
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step; False where the system or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def replace_with(stage: Path, out: Path) -> None:
    """Move the complete ``stage`` to ``out``; an existing ``out`` is swapped out, never lost."""
    if not out.exists():
        os.rename(stage, out)
    elif exchange(stage, out):
        _remove(stage)  # holds the old output now
    else:
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=out.parent))
        os.replace(out, old)
        os.rename(stage, out)
        _remove(old)


@contextmanager
def staged_output(out: Path, force: bool, is_ours: Callable[[Path], bool] = is_infopt_output) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces ``out``, on failure it is removed.
    Hold ``claim_output(out)`` around the whole build; this takes it here if the caller did not."""
    out = Path(out).absolute()
    lock = _lock_path(out)
    with (nullcontext(out) if lock in _HELD else claim_output(out, force, is_ours)):
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
        os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes it private; the output is read by servers as other users
        _PENDING[stage] = None
        try:
            yield stage
            if out.exists():
                if not force:
                    raise OutputExistsError(f"output folder {out} appeared during the build", fix="pass --force to replace it")
                if any(out.iterdir()) and not is_ours(out):
                    raise UsageError(f"{out} became a folder infopt did not write during the build; it was left as it is",
                                     fix="choose another --output")
            replace_with(stage, out)
        finally:
            _PENDING.pop(stage, None)
            if stage.exists():
                _remove(stage)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
