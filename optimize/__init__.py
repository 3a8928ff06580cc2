"""infopt: turn a trained PyTorch model into a validated, deployable inference artifact.

``infopt.build(...)`` builds, validates and emits; ``infopt.load(dist_dir)`` returns a callable
runner for an emitted artifact; ``infopt.gate(candidate, baseline)`` is the release gate;
``infopt.sweep("sweep.yaml")`` builds a grid of them and compares.
Heavy libraries load on first use, so ``import infopt`` is quick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infopt.core.version import __version__

if TYPE_CHECKING:
    from infopt.api.build_config import BuildConfig
    from infopt.api.gating import gate
    from infopt.api.inprocess import compile
    from infopt.api.orchestrator import BuildResult, build, load
    from infopt.api.sweep import sweep

__all__ = ["build", "load", "gate", "compile", "sweep", "BuildConfig", "BuildResult", "__version__"]


def __getattr__(name: str):
    # lazy: `import infopt` loads no torch; the API loads on first use (PEP 562)
    if name in ("build", "load", "BuildResult"):
        from infopt import api

        return getattr(api, name)
    if name == "BuildConfig":
        from infopt.api.build_config import BuildConfig

        return BuildConfig
    if name == "gate":
        from infopt.api.gating import gate

        return gate
    if name == "compile":
        from infopt.api.inprocess import compile

        return compile
    if name == "sweep":
        from infopt.api.sweep import sweep

        return sweep
    raise AttributeError(f"module 'infopt' has no attribute {name!r}")
