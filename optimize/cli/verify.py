"""``infopt verify DIST``: check an output folder's files against its manifest, nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, stdout, table


def verify(
    dist: Annotated[Path, typer.Argument(help="An output folder written by `infopt build` (or its manifest.json).")],
    as_json: o.Json = False,
) -> None:
    """Re-hash every file against the manifest; exit 1 on any changed, missing or added file."""
    from infopt.exporters.dist import output_root
    from infopt.provenance import verify as run_verify

    result = run_verify(output_root(dist))
    if as_json:
        print_json(result)
    else:
        console = stdout()
        rows = [[f["path"], f["status"] if f["status"] == "ok" else f["status"].upper(), f["bytes"] if f["bytes"] is not None else "-",
                 (f["sha256"] or "-")[:16]] for f in result["files"]]
        console.print(table(f"{result['name']}: files against manifest.json", ["path", "status", "bytes", "sha256 (first 16)"], rows))
        prov = result.get("provenance") or {}
        made_by = prov.get("command") or prov.get("python_call")
        if made_by:
            console.print(f"built by: {made_by}", markup=False)
        console.print(f"manifest.json sha256: {result['manifest_sha256']}", markup=False)
        if result["passed"]:
            console.print(f"OK: all {len(result['files'])} files match", style="bold green", markup=False)
        else:
            console.print("MISMATCH: " + "; ".join(result["problems"]), style="bold red", markup=False)
    if not result["passed"]:
        raise typer.Exit(1)
