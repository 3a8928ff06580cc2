"""infopt's cache folder: ``$INFOPT_CACHE_DIR`` (default ``~/.cache/infopt``), one subfolder per use.

Calibration tables, Inductor's compiled kernels and TensorRT timing caches all live here, so a
user can see, size and clear everything infopt keeps between builds in one place.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("INFOPT_CACHE_DIR") or Path.home() / ".cache" / "infopt")


def cache_dir(name: str) -> Path:
    """``<cache root>/<name>``, created if missing."""
    folder = cache_root() / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
