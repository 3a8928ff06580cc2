"""One table of a report: a title, headers, rows and notes; rendered as markdown, HTML and rich by
``infopt.report``. It stands on the ground floor so that a pass can give its own section (``PassDetails.sections``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def format_number(value: Any, fmt: str = ".4g") -> str:
    """A table cell for a figure: ``-`` for none, a string as it is, else ``format(value, fmt)``."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, fmt)


def format_bytes(n: int | None) -> str:
    """A size in B, KiB, MiB or GiB."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
