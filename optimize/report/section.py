"""One table of a report: a title, headers, rows and notes; rendered as markdown, HTML and rich."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Section:
    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
