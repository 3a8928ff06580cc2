"""The public API: ``build``, ``load``, ``validate``, ``gate``, ``compile``. Each module here is a
top floor over everything below; the CLI is the only thing above it."""

from __future__ import annotations

from infopt.api.build import BuildResult, build, load, validate
from infopt.runtime.backends import manifest_runner

__all__ = ["BuildResult", "build", "load", "manifest_runner", "validate"]
