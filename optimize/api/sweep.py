"""``infopt sweep``: every cell of a sweep file built, locally in a pool of processes, then compared.

Each cell is one ordinary ``infopt build`` (the same command a user runs, with ``--json``), in a
process of its own: a build that crashes, or hangs past the sweep's ``timeout_s`` (its process group
is killed), is that cell's result and the others go on. ``jobs`` builds run at once (default: one
per two cores, at most one per 4 GiB of memory). A cell whose target cannot run it is listed as
such and not started. A cell whose command and input files are byte-identical to one already built
into its folder is reused, not rebuilt: ``<label>.sweep-cell.json`` beside the folder records the key
(beside, not inside, so the folder stays exactly what the build wrote and ``infopt verify`` passes).

The results are ``sweep.json``, ``sweep.md`` and ``sweep.html`` in the output root
(``report/sweep.py``), and ``SweepResult``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from infopt.core.errors import EnvironmentProblem
from infopt.core.manifest import MANIFEST, read_manifest
from infopt.core.sweep_spec import Cell, cells, read_sweep
from infopt.report.sweep import write_reports

CELL_RECORD = ".sweep-cell.json"
"""suffix of the record beside a cell's folder"""
GIB = 2**30


@dataclass
class CellResult:
    model: str
    target: str
    precision: str
    backend: str
    status: str
    """passed, failed (validation), error (the build stopped), timeout, unsupported, reused"""
    folder: str
    seconds: float = 0.0
    exit_code: int | None = None
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    """from the cell's manifest: recipe, backend, precision shipped, drift, latency, size, cost"""

    @property
    def label(self) -> str:
        return f"{self.target}-{self.precision}-{self.backend}"

    @property
    def built(self) -> bool:
        return self.status in ("passed", "failed", "reused")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepResult:
    root: Path
    cells: list[CellResult]

    @property
    def passed(self) -> bool:
        """Every cell that could run built and passed its validation."""
        return all(c.status in ("passed", "reused", "unsupported") for c in self.cells) and any(c.built for c in self.cells)


def default_jobs() -> int:
    cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 8 * GIB
    return max(1, min(cores // 2, int(memory // (4 * GIB))))


def sweep(path: str | Path, *, jobs: int | None = None, progress: Callable[[str], None] | None = None) -> SweepResult:
    """Build every cell of the sweep file at ``path`` and write the comparison into its output root."""
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
            results[i] = _result(cell, "unsupported", error=cell.unsupported)
        elif (reused := _reusable(cell)) is not None:
            results[i] = reused
        else:
            runnable.append((i, cell))
    counts = {"done": len(results), "running": 0, "failed": 0}
    say(f"{len(grid)} cells: {len(runnable)} to build, {len(results)} unsupported or already built")

    lock = threading.Lock()

    def run(item):
        i, cell = item
        with lock:
            counts["running"] += 1
            say(f"building {cell.model} {cell.label} ({counts['done']}/{len(grid)} done, {counts['running']} running)")
        result = _build(cell)
        with lock:
            counts["running"] -= 1
            counts["done"] += 1
            counts["failed"] += result.status != "passed"
            say(f"{cell.model} {cell.label}: {result.status} ({counts['done']}/{len(grid)} done, "
                f"{counts['failed']} not passed)")
        return i, result

    with ThreadPoolExecutor(max_workers=max(1, jobs or default_jobs())) as pool:
        for i, result in pool.map(run, runnable):
            results[i] = result
    outcome = SweepResult(root, [results[i] for i in range(len(grid))])
    write_reports(root, [c.to_json() for c in outcome.cells])
    return outcome


def _result(cell: Cell, status: str, **fields) -> CellResult:
    return CellResult(cell.model, cell.target, cell.precision, cell.backend, status, str(cell.folder), **fields)


def _record(cell: Cell) -> Path:
    return cell.folder.with_name(cell.folder.name + CELL_RECORD)


def _reusable(cell: Cell) -> CellResult | None:
    record = _record(cell)
    if not (record.is_file() and (cell.folder / MANIFEST).is_file()):
        return None
    try:
        kept = json.loads(record.read_text())
        if kept.get("key") != cell.key():
            return None
        return _result(cell, "reused", seconds=0.0, exit_code=kept.get("exit_code"), summary=_summary(cell.folder))
    except Exception:  # noqa: BLE001 - an unreadable record or folder is simply built again
        return None


def _build(cell: Cell) -> CellResult:
    """One ``infopt build`` in its own process group, stopped (the whole group) at the cell's timeout."""
    timeout = cell.timeout_s
    command = [*infopt_command(), "build", *cell.args, "--json", "--quiet"]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=cell.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        return _result(cell, "timeout", seconds=time.monotonic() - start,
                       error=f"still building after {timeout:g} s (timeout_s): stopped")
    seconds = time.monotonic() - start
    answer = _json(out)
    if proc.returncode in (0, 1) and answer.get("output_dir"):
        status = "passed" if proc.returncode == 0 else "failed"
        summary = _summary(cell.folder)
        _record(cell).write_text(json.dumps({"key": cell.key(), "exit_code": proc.returncode}) + "\n")
        reasons = summary.get("reasons") or []
        return _result(cell, status, seconds=seconds, exit_code=proc.returncode, summary=summary,
                       error="; ".join(reasons) if status == "failed" else None)
    error = answer.get("error") or (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return _result(cell, "error", seconds=seconds, exit_code=proc.returncode, error=error)


def infopt_command() -> list[str]:
    """The ``infopt`` command a user runs: the one installed beside this Python, else the one on PATH."""
    beside = Path(sys.executable).with_name("infopt")
    found = str(beside) if beside.is_file() else shutil.which("infopt")
    if found is None:
        raise EnvironmentProblem("the infopt command is not installed beside this Python or on PATH, and a sweep runs "
                                 "each cell as an `infopt build`", fix="pip install infopt (or pip install -e . in a clone)")
    return [found]


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _summary(folder: Path) -> dict[str, Any]:
    """What the comparison needs from a built cell's manifest."""
    m = read_manifest(folder)
    infopt = [r for r in m.validation.latency if r.runner == "infopt"]
    eager = {r.batch: r for r in m.validation.latency if r.runner == "eager"}
    worst = m.validation.drift.get("worst", {})
    price = m.target.price_per_hour
    return {
        "recipe": m.recipe.get("name"), "backend": m.backend, "precision": m.precision,
        "passed": m.validation.verdict.passed, "reasons": m.validation.verdict.reasons,
        "drift": {k: worst.get(k) for k in ("max_abs", "cosine_min", "cosine_mean", "top1", "sqnr_db")},
        "latency": [{"batch": r.batch, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "throughput": r.throughput,
                     "speedup": eager[r.batch].p50_ms / r.p50_ms if r.batch in eager and r.p50_ms > 0 else None,
                     "usd_per_million": price / 3600 / r.throughput * 1e6 if price and r.throughput > 0 else None}
                    for r in infopt],
        "model_bytes": m.files[m.artifacts.model].bytes if m.artifacts.model in m.files else None,
        "measured_on": m.validation.device,
    }
