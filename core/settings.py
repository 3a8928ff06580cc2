"""The fields of a build's settings, for the sections of ``infopt.BuildConfig`` wherever they are defined: the
build's own in ``optimize/api/build_config.py``, each quantization method's beside it in ``quantize/``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def setting(default: Any, description: str, flag: str | tuple[str, ...] | None = None, *, logits_only: bool = False,
            generation_only: bool = False, **kwargs: Any) -> Any:
    """A field of a section: its default, its help (``description``), the flag that sets it (with its short form, as
    a tuple) and which task takes it."""
    extra = {"flag": flag, "logits_only": logits_only, "generation_only": generation_only}
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


class Section(BaseModel):
    """One section of ``infopt.BuildConfig``: typed fields made with :func:`setting`, no other key allowed."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_assignment=True)
