"""infopt: turn a trained PyTorch model into a validated, deployable inference artifact.

``infopt.build(...)`` builds, validates and emits; ``infopt.load(dist_dir)`` returns a callable
runner for an emitted artifact; ``infopt.gate(candidate, baseline)`` is the release gate. Heavy libraries load on first use, so ``import infopt`` is quick.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

try:
    __version__ = version("infopt")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+local"

if TYPE_CHECKING:
    from infopt.api import BuildResult, build, load
    from infopt.gating import gate
    from infopt.inprocess import compile

__all__ = ["build", "load", "gate", "compile", "BuildResult", "__version__"]


def __getattr__(name: str):
    if name in ("build", "load", "BuildResult"):
        from infopt import api

        return getattr(api, name)
    if name == "gate":
        from infopt.gating import gate

        return gate
    if name == "compile":
        from infopt.inprocess import compile

        return compile
    raise AttributeError(f"module 'infopt' has no attribute {name!r}")
