"""The public API: ``build``, ``load``, ``validate``, ``gate``, ``compile``. Each module here is a
top floor over everything below; the CLI is the only thing above it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infopt.api.orchestrator import BuildResult, build, load
    from infopt.api.output_check import validate
    from infopt.runtime.backends import manifest_runner

__all__ = ["BuildResult", "build", "load", "manifest_runner", "validate"]


def __getattr__(name: str):
    # lazy: `infopt verify` and `infopt sign` import infopt.api.provenance without loading the build
    # (torch, every pass); build, load and validate load on first use (PEP 562)
    if name in ("BuildResult", "build", "load"):
        from infopt.api import orchestrator as module

        return getattr(module, name)
    if name == "validate":
        from infopt.api.output_check import validate

        return validate
    if name == "manifest_runner":
        from infopt.runtime.backends import manifest_runner

        return manifest_runner
    raise AttributeError(f"module 'infopt.api' has no attribute {name!r}")
