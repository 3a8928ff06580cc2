"""Plugins from other packages: a distribution that declares an ``infopt.plugins`` entry point is imported
once, after infopt's own registries are filled, as pytest loads its ``pytest11`` plugins.

The entry point's value is a module (importing it registers what it defines through infopt's registries:
``runtime.backend.register``, ``core.pass_api.register``, ``quantize.calibrators.register``, a server
emitter's ``register``) or ``module:function`` (imported, then the function is called with no arguments)::

    [project.entry-points."infopt.plugins"]
    toy = "toy_plugin"

A plugin that fails (its import or its function raises) is named in one warning and skipped; the rest
of infopt goes on. Nothing here imports the plugins' registries: the floor that fills them
(``infopt.api.registries``) calls :func:`load_plugins`, so this floor names nothing above it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

GROUP = "infopt.plugins"
"""the entry point group a plugin declares itself in"""

log = logging.getLogger("infopt.plugins")


@dataclass(frozen=True)
class Plugin:
    """One entry point of the group, and what loading it did."""

    name: str
    """the entry point's name"""
    value: str
    """``module`` or ``module:function``"""
    distribution: str
    version: str
    error: str | None = None
    """the exception's type and first line, where loading failed"""

    @property
    def loaded(self) -> bool:
        return self.error is None

    @property
    def fix(self) -> str:
        return "" if self.loaded else (f"fix or uninstall {self.distribution} (pip uninstall {self.distribution}); "
                                       "`infopt -v doctor` shows the traceback")

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "distribution": self.distribution, "version": self.version, "module": self.value,
                "loaded": self.loaded, "error": self.error}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def load(entry_point: EntryPoint) -> Plugin:
    """Import one entry point's module (and call its function where it names one); a failure is a warning
    and the returned ``Plugin``'s ``error``, never an exception."""
    dist = entry_point.dist
    name, version = (dist.metadata["Name"], dist.version) if dist is not None else ("(unknown distribution)", "?")
    plugin = Plugin(entry_point.name, entry_point.value, name, version)
    try:
        target = entry_point.load()
        if entry_point.attr:
            if not callable(target):
                raise TypeError(f"{entry_point.value} is not a function infopt can call")
            target()
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop infopt
        plugin = Plugin(entry_point.name, entry_point.value, name, version, first_line(exc))
        log.warning("plugin %r (%s %s, %s) failed to load and was skipped: %s; %s", plugin.name, name, version,
                    plugin.value, plugin.error, plugin.fix)
        log.info("the traceback of plugin %r:", plugin.name, exc_info=exc)
        return plugin
    log.info("loaded plugin %r (%s %s, %s)", plugin.name, name, version, plugin.value)
    return plugin


def declared() -> bool:
    """Whether any distribution on the path declares an entry point of :data:`GROUP` (nothing is imported)."""
    return bool(entry_points(group=GROUP))


@functools.cache
def load_plugins() -> tuple[Plugin, ...]:
    """Load every plugin of :data:`GROUP` on the path, by name; the second call returns the first's result
    and loads nothing."""
    return tuple(load(ep) for ep in sorted(entry_points(group=GROUP), key=lambda ep: (ep.name, ep.value)))
