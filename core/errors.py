"""The errors a user can cause, each with its exit code.

Every message says what failed, where (file, module path, graph node) and what to do next.
The CLI prints the message and exits with ``exit_code``; it never shows a traceback for these.

Exit codes: 0 ok; 1 validation or gate failed; 2 bad input or usage; 3 build failed (export,
compile); 4 environment (a backend is not installed or no device).
"""

from __future__ import annotations

import errno


class InfoptError(Exception):
    """Base of every error a user can cause and fix."""

    exit_code = 3
    title = "infopt failed"

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        lines = [self.what]
        if self.where:
            lines.append(f"  where: {self.where}")
        if self.fix:
            lines.append(f"  fix:   {self.fix}")
        return "\n".join(lines)


class ValidationFailed(InfoptError):
    """The artifact was built but missed a drift or latency threshold."""

    exit_code = 1
    title = "validation failed"


class UsageError(InfoptError):
    """Bad input: a missing or corrupt file, a malformed option, an output that exists."""

    exit_code = 2
    title = "bad input"


class ModelLoadError(UsageError):
    """The model file could not be read as any supported format."""

    title = "cannot load model"


class UnsafePickleError(UsageError):
    """The file holds a pickled Python object and loading it would run code from the file."""

    title = "refusing to unpickle"


class InputSpecError(UsageError):
    """An ``--input``/``--dim`` value or an example input does not describe valid inputs."""

    title = "bad input spec"


class TooLargeError(UsageError):
    """The build would need more memory than this machine has: refused before any work."""

    title = "too large for this machine"


class RecipeError(UsageError):
    """A recipe, target or precision that does not exist or does not fit together."""

    title = "bad recipe"


class IntegrityError(UsageError):
    """An output folder differs from its manifest, or its manifest from its signature."""

    title = "integrity"


class OutputExistsError(UsageError):
    """The output folder exists and ``--force`` was not given."""

    title = "output exists"


class BuildError(InfoptError):
    """A pass failed: capture, export, compile."""

    exit_code = 3
    title = "build failed"


class CaptureError(BuildError):
    """``torch.export`` could not capture the model's graph."""

    title = "capture failed"


class EnvironmentProblem(InfoptError):
    """A backend is not installed or a device is missing."""

    exit_code = 4
    title = "environment"


class DiskFull(EnvironmentProblem):
    """A disk filled while a build wrote to it."""

    title = "disk full"


DISK_FULL_TEXTS = ("No space left on device", "Not enough free space")
"""how a full disk reads in the errors of libraries that do not keep the errno (onnx's writers)"""


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, says a disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC or any(t in str(seen) for t in DISK_FULL_TEXTS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def first_line(exc: BaseException) -> str:
    """An exception's message, for one line of a report or an error: colour codes dropped, its first line, at most 400 characters."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    return text.splitlines()[0][:400] if text else "(no message)"
