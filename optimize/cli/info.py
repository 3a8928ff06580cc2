"""``infopt targets``, ``infopt recipes`` and ``infopt doctor``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, shown_path, stdout, table


def targets(
    as_json: o.Json = False,
    markdown: Annotated[bool, typer.Option("--markdown", metavar="", help="Print what each target builds (precision x backend) as the Markdown table of docs/guide/targets-and-backends.md.")] = False,
) -> None:
    """List the targets and what they run."""
    import infopt.api.registries  # noqa: F401 - registers every bundled pass, then the plugins' (a plugin's passes listed too)
    from infopt.core.recipe import build_table_markdown
    from infopt.core.target import targets as all_targets

    if markdown:
        print(build_table_markdown())
        return
    found = all_targets()
    if as_json:
        print_json({n: t.model_dump(mode="json") for n, t in found.items()})
        return
    rows = [[t.name, t.device, t.arch, t.description, ", ".join(t.precisions), ", ".join(t.backends),
             "-" if t.memory_bandwidth_gbs is None else f"{t.memory_bandwidth_gbs:g}",
             "-" if t.price_per_hour is None else f"{t.price_per_hour:g}"] for t in found.values()]
    stdout().print(table("Targets", ["name", "device", "arch", "description", "precisions", "backends",
                                     "GB/s", "USD/h"], rows))


def recipes(
    show_passes: Annotated[bool, typer.Option("--passes", metavar="", help="Also list every pass with its options.")] = False,
    as_json: o.Json = False,
) -> None:
    """List the bundled recipes (and passes)."""
    import infopt.api.registries  # noqa: F401 - registers every bundled pass, then the plugins' (a plugin's passes listed too)
    from infopt.core.pass_api import passes
    from infopt.core.recipe import bundled_recipes, load_recipe

    loaded = {name: load_recipe(path) for name, path in bundled_recipes().items()}
    registry = passes()
    if as_json:
        data = {"recipes": {n: r.to_json() for n, r in loaded.items()}}
        if show_passes:
            data["passes"] = {n: {"consumes": p.consumes, "produces": p.produces, "description": p.description,
                                  "options": p.describe_options()} for n, p in registry.items()}
        print_json(data)
        return
    console = stdout()
    rows = [[n, r.precision, r.backend, " -> ".join(s.name for s in r.passes), r.description] for n, r in loaded.items()]
    console.print(table("Recipes", ["name", "precision", "backend", "passes", "description"], rows))
    if show_passes:
        rows = [[n, f"{p.consumes} -> {p.produces}", p.description,
                 "; ".join(f"{x['name']}={x['default']!r}: {x['description']}"
                           + (f" (set by the build setting {x['build_setting']})" if x["build_setting"] else "")
                           for x in p.describe_options())]
                for n, p in registry.items()]
        console.print(table("Passes", ["pass", "representation", "what it does", "options"], rows))


def doctor(
    as_json: o.Json = False,
    clean: Annotated[Path, typer.Option("--clean", help="Folder whose leftovers of killed builds to remove (those no live build owns).")] = Path("dist"),
) -> None:
    """Which backends and devices are available here, and why not, and the plugins other packages declare; removes what killed builds left in dist/ and $TMPDIR."""
    from infopt.api.registries import plugins
    from infopt.core.work_folders import clean_dead_work_folders
    from infopt.exporters.staging import clean_stale
    from infopt.runtime.doctor import checks

    found = checks(plugins())
    removed = clean_stale(clean) + clean_dead_work_folders()
    if as_json:
        print_json(found)
        return
    rows = [[c["component"], "yes" if c["ok"] else "no", c["detail"], c["fix"]] for c in found]
    stdout().print(table("infopt doctor", ["component", "available", "detail", "to get it"], rows))
    for path in removed:
        stdout().print(f"removed {shown_path(path)}: left by a build that was killed", markup=False)
