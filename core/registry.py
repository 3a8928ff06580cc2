"""A registry of named plugins: passes, backends, server emitters and the rest each keep one. A plugin
registers itself from its own module; the floors below never list what stands on them."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from infopt.core.errors import UsageError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, name_of: Callable[[T], str]):
        self.kind = kind
        self.name_of = name_of
        self.items: dict[str, T] = {}
        """by name, in the order they registered"""

    def register(self, item: T) -> T:
        name = self.name_of(item)
        if self.items.get(name, item) is not item:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self.items[name] = item
        return item

    def all(self) -> dict[str, T]:
        return dict(self.items)

    def named(self, name: str) -> T:
        if name not in self.items:
            raise UsageError(f"unknown {self.kind} {name!r}", fix=f"use one of: {', '.join(self.items) or '(none registered)'}")
        return self.items[name]


def __getattr__(name: str):
    """The Pass API lived here before ``core/pass_api.py``: ``from infopt.core.registry import Pass`` keeps working
    for plugins written then, with a DeprecationWarning naming the new module."""
    import importlib
    import warnings

    pass_api = importlib.import_module("infopt.core.pass_api")  # by name: the Pass API imports this module
    if name.startswith("_") or not hasattr(pass_api, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"infopt.core.registry.{name} moved to infopt.core.pass_api.{name}", DeprecationWarning, stacklevel=2)
    return getattr(pass_api, name)
