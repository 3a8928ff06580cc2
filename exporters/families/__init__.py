"""Architecture families: what infopt must know about a transformers ``model_type`` that its config and modules
do not say. One module per family registers a :class:`Family`; importing this package registers every one.

Most of what a build needs it reads from the model itself: the cache layout, the rotary table, a sliding window,
a tied head. A family module holds only what cannot be read that way, such as which model types ONNX Runtime
GenAI runs under their own name. No ``model_type`` string is compared outside this folder (a test checks it):
code that needs a family's quirk asks :func:`family_of`. ``docs/contributing/add-an-architecture.md`` says how to
add one.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any

from infopt.core.registry import Registry


@dataclass(frozen=True)
class Family:
    """One family's quirks, for the ``model_type`` values in ``model_types``."""

    name: str
    model_types: tuple[str, ...]
    """the configs' ``model_type`` values of the family"""
    genai_native: bool = False
    """ONNX Runtime GenAI runs its decoder under its own model type with the standard inputs (``genai_config.json``'s
    ``model.type``, as of GenAI 0.18); otherwise the folder names GenAI's generic ``decoder``. GPT-2 is not: GenAI's
    ``gpt2`` type expects its model builder's own input names."""
    attention_sinks: bool = False
    """its attention adds learned sink logits, which ONNX Runtime's GroupQueryAttention does not: the decoder keeps
    the model's own attention"""


FAMILIES: Registry[Family] = Registry("architecture family", lambda family: family.name)
GENERIC = Family("generic", ())
"""what a model of an unlisted type gets: nothing beyond what its config and modules say"""


def register(family: Family) -> Family:
    """Register ``family``; a ``model_type`` already claimed by another family is refused."""
    for other in FAMILIES.all().values():
        shared = set(other.model_types) & set(family.model_types)
        if shared and other.name != family.name:
            raise ValueError(f"model type {sorted(shared)[0]!r} is in families {other.name!r} and {family.name!r}")
    return FAMILIES.register(family)


def family_of(config: Any) -> Family:
    """The family of a transformers ``config`` (its ``model_type``), or :data:`GENERIC`."""
    model_type = str(getattr(config, "model_type", "") or "")
    return next((f for f in FAMILIES.all().values() if model_type in f.model_types), GENERIC)


def genai_model_type(config: Any) -> str:
    """``genai_config.json``'s ``model.type`` for a decoder of ``config``: its own type where GenAI runs it, else
    ``decoder``."""
    return str(config.model_type) if family_of(config).genai_native else "decoder"


for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["FAMILIES", "GENERIC", "Family", "family_of", "genai_model_type", "register"]
