"""``infopt sweep``: every cell of a sweep file built, locally in a pool of processes or as Ray tasks on
a cluster (``api/sweep_ray.py``), then compared.

Each cell is one ordinary ``infopt build`` (the same command a user runs, with ``--json``), in a
process of its own: a build that crashes, or hangs past the sweep's ``timeout_s`` (its process group
is killed), is that cell's result and the others go on. Locally, ``jobs`` builds run at once
(default: one per ``cpus_per_cell`` cores, at most one per 4 GiB of memory). A cell whose target
cannot run it is listed as such and not started. A cell whose command and input files are byte-identical to one already built
into its folder is reused, not rebuilt: ``<label>.sweep-cell.json`` beside the folder records the key
(beside, not inside, so the folder stays exactly what the build wrote and ``infopt verify`` passes).

A cell's run and result are ``api/sweep_cell.py``. The results are ``sweep.json``, ``sweep.md`` and ``sweep.html`` in the output root
(``report/sweep.py``), and ``SweepResult``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infopt.api.sweep_cell import CellResult, Progress, build_here, cell_result, reusable
from infopt.api.sweep_ray import run_on_ray
from infopt.core.sweep_spec import cells, read_sweep
from infopt.report.sweep import write_reports

GIB = 2**30


@dataclass
class SweepResult:
    root: Path
    cells: list[CellResult]

    @property
    def passed(self) -> bool:
        """Every cell that could run built and passed its validation."""
        return all(c.status in ("passed", "reused", "unsupported") for c in self.cells) and any(c.built for c in self.cells)


def default_jobs(cpus_per_cell: int = 2) -> int:
    cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 * GIB
    return max(1, min(cores // cpus_per_cell, int(memory // (4 * GIB))))


def sweep(path: str | Path, *, jobs: int | None = None, ray: str | None = None,
          progress: Callable[[str], None] | None = None) -> SweepResult:
    """Build every cell of the sweep file at ``path`` and write the comparison into its output root.

    ``ray``: None builds in a local pool of ``jobs`` processes; ``"auto"`` runs each cell as a Ray task
    on the Ray this process is connected to, else the cluster ``RAY_ADDRESS`` or ``ray start`` names,
    else a Ray started on this machine; any other value is a cluster's address."""
    path = Path(path)
    spec = read_sweep(path)
    base = path.parent.resolve()
    root = (base / spec.output).resolve()
    grid = cells(spec, base, root)
    say = progress or (lambda _msg: None)
    results: dict[int, CellResult] = {}
    runnable = []
    for i, cell in enumerate(grid):
        if cell.unsupported:
            results[i] = cell_result(cell, "unsupported", error=cell.unsupported)
        elif (reused := reusable(cell)) is not None:
            results[i] = reused
        else:
            runnable.append((i, cell))
    say(f"{len(grid)} cells: {len(runnable)} to build, {len(results)} unsupported or already built")
    tracker = Progress(len(grid), len(results), say)
    if ray is not None:
        results.update(run_on_ray(runnable, ray, spec.cpus_per_cell, tracker))
    else:
        def run(item):
            i, cell = item
            tracker.started(cell)
            result = build_here(cell)
            tracker.finished(cell, result)
            return i, result

        with ThreadPoolExecutor(max_workers=max(1, jobs or default_jobs(spec.cpus_per_cell))) as pool:
            for i, result in pool.map(run, runnable):
                results[i] = result
    outcome = SweepResult(root, [results[i] for i in range(len(grid))])
    write_reports(root, [c.to_json() for c in outcome.cells])
    return outcome


