"""Temporary work folders, named after the process that made them, and the clean-up of dead ones.

A build works in folders under ``$TMPDIR`` (``infopt-<kind>-<pid>-<random>``). A process that ends
normally, fails or is stopped by SIGTERM removes its own; one killed with SIGKILL (or by the kernel
for memory) cannot. Every build, and ``infopt doctor``, removes those whose process is gone.
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
