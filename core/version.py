"""The installed version of infopt."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("infopt")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+local"
