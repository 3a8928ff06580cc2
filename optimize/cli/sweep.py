"""``infopt sweep SWEEP.yaml``: many builds from one file, in a local pool or on Ray, and one comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from infopt.cli import options as o
from infopt.cli.output import print_json, shown_path, stderr, stdout


def sweep(
    spec: Annotated[Path, typer.Argument(help="A sweep YAML file: models, targets, precisions, backends, data, thresholds, output (see docs/guide/sweeps.md).")],
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Local builds at once (default: one per cpus_per_cell cores, 2 unless the file says, at most one per 4 GiB of memory; not used with --ray).")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="auto|ADDRESS", help="Run each cell as a Ray task: `auto` for RAY_ADDRESS's or this machine's Ray (else a new local one), or a cluster's address. GPU cells go to nodes with the target's GPU.")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Also write a JUnit XML file: one testcase per cell.")] = None,
    as_json: o.Json = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="No progress lines.")] = False,
) -> None:
    """Build every cell of a sweep (model x target x precision x backend), each an ordinary build in a
    process of its own (locally, or as a Ray task with --ray), and write sweep.md, sweep.json and sweep.html; exit 1 when a cell that could
    run did not pass."""
    from infopt.api.sweep import sweep as run_sweep
    from infopt.report.markdown import print_sections
    from infopt.report.sweep import sections, to_junit

    err = stderr()
    result = run_sweep(spec, jobs=jobs, ray=ray, progress=None if quiet else (lambda line: err.print(line, markup=False)))
    cells = [c.to_json() for c in result.cells]
    if junit is not None:
        junit.write_text(to_junit(cells))
    if as_json:
        print_json({"passed": result.passed, "output": shown_path(result.root), "cells": cells})
    else:
        print_sections(stdout(), sections(cells))
        stdout().print(f"wrote {shown_path(result.root)}/ (sweep.md, sweep.html, sweep.json)", markup=False)
    if not result.passed:
        raise typer.Exit(1)
