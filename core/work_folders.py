"""Temporary work folders, named after the process that made them, and the clean-up of dead ones.

A build works in folders under ``$TMPDIR`` (``infopt-<kind>-<pid>-<random>``). A process that ends
normally, fails or is stopped by SIGTERM removes its own; one killed with SIGKILL (or by the kernel
for memory) cannot. Every build, and ``infopt doctor``, removes those whose process is gone.

A file the build wrote in its work folder reaches the output as a hard link where the two lie on one file
system (:func:`place_file`): a model's weights are then written once, not once for the model and again for
each server's copy of it, and the output's copies of one file are one file on disk.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

_WORK = re.compile(r"^infopt-(?P<kind>[a-z0-9]+)-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def work_folder(kind: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for ``kind`` of work (``build``, ``calib``...), removed when the block ends."""
    return tempfile.TemporaryDirectory(prefix=f"infopt-{kind}-{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


def clean_dead_work_folders(root: Path | None = None) -> list[Path]:
    """Remove the work folders under ``root`` (default ``$TMPDIR``) whose process no longer runs."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _WORK.match(path.name)
        if match and int(match["pid"]) != os.getpid() and path.is_dir() and not path.is_symlink() \
                and not _alive(int(match["pid"])):
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path)
    return removed


def in_work_folder(path: Path) -> bool:
    """Whether ``path`` lies in one of this process's work folders (a file the build wrote, no one else's)."""
    try:
        relative = Path(path).resolve().relative_to(Path(tempfile.gettempdir()).resolve())
    except ValueError:
        return False
    match = _WORK.match(relative.parts[0]) if relative.parts else None
    return bool(match) and int(match["pid"]) == os.getpid()


def link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link to ``src``, or a copy where the file system cannot link them. An existing ``dst``
    is removed first, so that nothing ever writes through a link into the file it shares."""
    dst = Path(dst)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def place_file(src: Path, dst: Path) -> None:
    """``src`` at ``dst``: linked where the build wrote it (:func:`in_work_folder`), else copied (a user's own file
    is never linked into an output, where changing one would change the other)."""
    if in_work_folder(src):
        link_or_copy(src, dst)
    else:
        shutil.copyfile(src, dst)
