"""Lineage: what each pass did to a model, as the manifest and report show it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PassRecord:
    """What one pass did: the lineage entry the manifest and report show."""

    name: str
    consumes: str
    produces: str
    seconds: float = 0.0
    size_bytes: int | None = None
    changed: bool = False
    skipped: bool = False
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
