"""One cell of a sweep: its ``infopt build`` run in a process of its own (here, or on a Ray worker),
how it ended (``CellResult``: passed, failed, error, timeout, unsupported, reused), what the comparison
needs from its manifest, and whether an earlier build of the same command and inputs can be reused.
``api/sweep.py`` runs the cells in a local pool, ``api/sweep_ray.py`` on Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from infopt.core.errors import EnvironmentProblem
from infopt.core.manifest import MANIFEST, read_manifest
from infopt.core.sweep_spec import Cell

CELL_RECORD = ".sweep-cell.json"
"""suffix of the record beside a cell's folder"""


@dataclass
class CellResult:
    model: str
    target: str
    precision: str
    backend: str
    status: str
    """passed, failed (validation), error (the build stopped), timeout, unsupported, reused"""
    folder: str
    ran_on: str | None = None
    """the host that built it (and the Ray node, on Ray)"""
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


class Progress:
    """The sweep's progress lines: cells done, running, not passed."""

    def __init__(self, total: int, done: int, say: Callable[[str], None]):
        self.total, self.counts, self.say = total, {"done": done, "running": 0, "failed": 0}, say
        self.lock = threading.Lock()

    def started(self, cell: Cell, where: str = "") -> None:
        with self.lock:
            self.counts["running"] += 1
            self.say(f"building {cell.model} {cell.label}{where} ({self.counts['done']}/{self.total} done, "
                     f"{self.counts['running']} running)")

    def finished(self, cell: Cell, result: CellResult) -> None:
        with self.lock:
            self.counts["running"] -= 1
            self.counts["done"] += 1
            self.counts["failed"] += result.status != "passed"
            self.say(f"{cell.model} {cell.label}: {result.status} ({self.counts['done']}/{self.total} done, "
                     f"{self.counts['running']} running, {self.counts['failed']} not passed)")


def cell_result(cell: Cell, status: str, **fields) -> CellResult:
    return CellResult(cell.model, cell.target, cell.precision, cell.backend, status, str(cell.folder), **fields)


def _record(cell: Cell) -> Path:
    return cell.folder.with_name(cell.folder.name + CELL_RECORD)


def reusable(cell: Cell) -> CellResult | None:
    record, key = _record(cell), cell.key  # the key taken now, before any build, is the one recorded after it
    if not (record.is_file() and (cell.folder / MANIFEST).is_file()):
        return None
    try:
        kept = json.loads(record.read_text())
        if kept.get("key") != key:
            return None
        return cell_result(cell, "reused", seconds=0.0, exit_code=kept.get("exit_code"), summary=_summary(cell.folder))
    except Exception:  # noqa: BLE001 - an unreadable record or folder is simply built again
        return None


@dataclass
class BuildRun:
    """How one ``infopt build`` process ended."""

    returncode: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool = False


def run_build(args: list[str], cwd: Path, timeout: float) -> BuildRun:
    """``infopt build ARGS --json --quiet`` in its own process group, stopped (the whole group) at
    ``timeout`` seconds. Runs where the cell runs: here, or on a Ray worker."""
    command = [*infopt_command(), "build", *args, "--json", "--quiet"]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return BuildRun(proc.returncode, out, err, time.monotonic() - start, timed_out=True)
    return BuildRun(proc.returncode, out, err, time.monotonic() - start)


def build_here(cell: Cell) -> CellResult:
    return conclude(cell, run_build(cell.args, cell.cwd, cell.timeout_s), socket.gethostname())


def conclude(cell: Cell, run: BuildRun, ran_on: str) -> CellResult:
    """The cell's result from how its build ended; its folder (when built) is in place."""
    if run.timed_out:
        return cell_result(cell, "timeout", ran_on=ran_on, seconds=run.seconds,
                           error=f"still building after {cell.timeout_s:g} s (timeout_s): stopped")
    answer = _json(run.out)
    if run.returncode in (0, 1) and answer.get("output_dir") and (cell.folder / MANIFEST).is_file():
        status = "passed" if run.returncode == 0 else "failed"
        summary = _summary(cell.folder)
        _record(cell).write_text(json.dumps({"key": cell.key, "exit_code": run.returncode}) + "\n")
        reasons = summary.get("reasons") or []
        return cell_result(cell, status, ran_on=ran_on, seconds=run.seconds, exit_code=run.returncode, summary=summary,
                           error="; ".join(reasons) if status == "failed" else None)
    error = answer.get("error") or (run.err.strip().splitlines() or [f"exit {run.returncode}"])[-1]
    return cell_result(cell, "error", ran_on=ran_on, seconds=run.seconds, exit_code=run.returncode, error=error)


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
    generation = (m.validation.model_extra or {}).get("generation")
    if generation:
        return _generation_summary(m, generation)
    infopt = [r for r in m.validation.latency if r.runner == "infopt"]
    eager = {r.batch: r for r in m.validation.latency if r.runner == "eager"}
    worst = m.validation.drift.get("worst", {})
    # a GPU target's build validated on a machine without that GPU (a local sweep on a CPU machine) timed
    # itself on the CPU: its latency and cost are not the target's
    on_target = m.target.device == "cpu" or not m.validation.device.startswith("cpu")
    price = m.target.price_per_hour if on_target else None
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
        "measured_on_target": on_target,
    }


def _generation_summary(m, generation: dict[str, Any]) -> dict[str, Any]:
    """A text-generation cell: its latency rows are TPOT per batch (throughput in tokens/s, cost per million
    output tokens), its accuracy the teacher-forced top-1 agreement with FP32."""
    forced = generation.get("teacher_forced") or {}
    return {
        "recipe": m.recipe.get("name"), "backend": m.backend, "precision": m.precision, "task": "text-generation",
        "passed": m.validation.verdict.passed, "reasons": m.validation.verdict.reasons,
        "drift": {"top1": forced.get("top1"), "ppl_delta": forced.get("ppl_delta")},
        "latency": [{"batch": r["batch"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "throughput": r["tokens_per_s"],
                     "speedup": None, "usd_per_million": r.get("usd_per_million_tokens")} for r in generation["tpot"]],
        "ttft_ms": generation["ttft"][0]["p50_ms"] if generation.get("ttft") else None,
        "model_bytes": m.files[m.artifacts.model].bytes if m.artifacts.model in m.files else None,
        "measured_on": m.validation.device,
        "measured_on_target": True,
    }
