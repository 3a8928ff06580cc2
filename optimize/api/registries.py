"""Every registry filled: the bundled passes, backends, servers, tasks and calibration methods, then the
plugins other packages declare (``infopt.plugins`` entry points, ``core/plugin_loader.py``), which register
into the same registries. Importing this module does it, once a process; ``infopt.api.emit`` imports it,
so the builder, ``load``, the gate and every CLI command that builds see the plugins."""

from __future__ import annotations

import infopt.passes  # noqa: F401 - registers the bundled passes
from infopt.core.plugin_loader import Plugin, load_plugins
from infopt.exporters import servers  # noqa: F401 - registers the bundled servers
from infopt.quantize import calibrators  # noqa: F401 - registers the bundled calibration methods
from infopt.runtime import backends, tasks  # noqa: F401 - register the bundled backends and tasks

load_plugins()


def plugins() -> tuple[Plugin, ...]:
    """The plugins found, each loaded or with its error (for ``infopt doctor``)."""
    return load_plugins()
