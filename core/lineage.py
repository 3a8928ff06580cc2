"""Lineage: what each pass did to a model, as the manifest and report show it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PassRecord:
    """What one pass did: the lineage entry the manifest and report show."""

    __pydantic_config__ = {"use_attribute_docstrings": True}  # the docstrings below describe the manifest's fields

    name: str
    """the pass's name, as recipes give it"""
    consumes: str
    """the representation it took (``exported``, ``onnx``...)"""
    produces: str
    """the representation it gave"""
    seconds: float = 0.0
    """how long it ran"""
    size_bytes: int | None = None
    """the size of the model it left"""
    changed: bool = False
    """whether it changed the model"""
    skipped: bool = False
    """whether it was skipped: the model was already past the representation it consumes"""
    notes: list[str] = field(default_factory=list)
    """what it says it did, one line each"""
    details: dict[str, Any] = field(default_factory=dict)
    """its own results, typed by the pass's ``PassDetails``"""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)
