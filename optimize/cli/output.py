"""Consoles and printing helpers: results on stdout, progress and errors on stderr."""

from __future__ import annotations

import json
from typing import Any


def stdout():
    """Results on stdout; 140 columns when piped (CI logs, files), so tables are not squeezed to 80."""
    import sys

    from rich.console import Console

    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 140)


def stderr():
    from rich.console import Console

    return Console(stderr=True)


def print_json(data: Any) -> None:
    from infopt.core.manifest_schema import jsonable

    print(json.dumps(jsonable(data), indent=2, default=str))


def table(title: str, headers: list[str], rows: list[list[str]]):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for h in headers:
        t.add_column(h)
    for row in rows:
        t.add_row(*[str(c) for c in row])
    return t


def shown_path(path) -> str:
    """``path`` as the user would type it: relative to the working directory when it lies under it."""
    import os
    from pathlib import Path

    path = Path(path)
    try:
        return os.fspath(path.relative_to(Path.cwd()))
    except ValueError:
        return os.fspath(path)
