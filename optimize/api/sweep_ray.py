"""``infopt sweep --ray auto|ADDRESS``: each cell of a sweep as a Ray task on a cluster.

A cell's task asks for what its target needs: ``cpus_per_cell`` CPUs for ``cpu``; one GPU (and one
CPU) for a GPU target, with the target's ``accelerator_type`` (``recipes/targets.yaml``: ``H100``,
``A100``, ``L4``, ``T4``...) so that Ray places it only on a node labelled with that GPU
(``accelerator_type:H100``, which Ray sets on nodes it finds such a GPU on). A cell no node of the
cluster can hold is reported, not queued forever.

Inputs travel through Ray's object store: every local file or folder a cell's command names (model,
``--val``, ``--calib``, tokenizer) is put once and shared by the cells that name it; the worker
unpacks them into a folder of its own, runs the same ``infopt build`` a local cell runs (with the
cell's timeout), and sends the finished output folder back, which lands in the cell's place whole
(``exporters/staging.py``, as a local build's output does). A task whose worker is lost (the process or its node died) is
retried once by Ray, then reported as an error. Workers need infopt installed, as the driver has it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import socket
import sys
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from infopt.api.sweep_cell import BuildRun, CellResult, Progress, cell_result, conclude, run_build
from infopt.core.errors import EnvironmentProblem, InfoptError, UsageError
from infopt.core.sweep_spec import Cell
from infopt.core.target import Target, get_target
from infopt.exporters.staging import staged_output


def task_options(target: Target, cpus_per_cell: int) -> dict[str, Any]:
    """The Ray resources a cell for ``target`` asks for."""
    if target.device == "cpu":
        return {"num_cpus": cpus_per_cell}
    options: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1}
    if target.accelerator_type:
        options["accelerator_type"] = target.accelerator_type
    return options


def unplaceable(options: dict[str, Any], nodes: list[dict[str, float]]) -> str | None:
    """Why no node (its total resources, as ``ray.nodes()`` gives them) can run a task with these
    options, or None when one can."""
    wanted = {"CPU": options.get("num_cpus", 0), "GPU": options.get("num_gpus", 0)}
    if options.get("accelerator_type"):
        wanted[f"accelerator_type:{options['accelerator_type']}"] = 0.001
    if any(all(node.get(k, 0) >= v for k, v in wanted.items()) for node in nodes):
        return None
    if "accelerator_type" in options:
        return (f"no node of the Ray cluster has an {options['accelerator_type']} GPU (Ray resource "
                f"accelerator_type:{options['accelerator_type']}) with {wanted['CPU']:g} CPU to hold it")
    if wanted["GPU"]:
        return "no node of the Ray cluster has a GPU"
    return f"no node of the Ray cluster has {wanted['CPU']:g} CPUs (cpus_per_cell)"


def run_on_ray(runnable: list[tuple[int, Cell]], address: str, cpus_per_cell: int,
               progress: Progress) -> dict[int, CellResult]:
    """Run every cell as a Ray task and wait for all of them; results by the cells' indices."""
    ray = _ray()
    results: dict[int, CellResult] = {}
    pending: dict[Any, tuple[int, Cell]] = {}
    # Ray prints its workers' deaths and such on stdout from a thread of its own: to stderr with -v,
    # else nowhere (each cell's result says what happened), so that stdout stays the sweep's answer
    verbose = logging.getLogger("infopt").isEnabledFor(logging.INFO)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(sys.stderr if verbose else devnull):
        started_here = _connect(ray, address)
        try:
            _submit_and_wait(ray, runnable, cpus_per_cell, progress, results, pending)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started_here:
                ray.shutdown()
    return results


def _submit_and_wait(ray, runnable: list[tuple[int, Cell]], cpus_per_cell: int, progress: Progress,
                     results: dict[int, CellResult], pending: dict[Any, tuple[int, Cell]]) -> None:
    """Each cell a task (or an error, where no node can hold it), then their results as they end."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    largest = max((n.get("CPU", 0) for n in nodes), default=0)
    task = ray.remote(max_retries=1, retry_exceptions=False)(build_cell)
    shipped: dict[str, Any] = {}
    progress.say(f"Ray: {len(nodes)} node(s), {sum(n.get('CPU', 0) for n in nodes):g} CPUs, "
                 f"{sum(n.get('GPU', 0) for n in nodes):g} GPUs")
    for i, cell in runnable:
        options = task_options(get_target(cell.target), max(1, min(cpus_per_cell, int(largest))))
        reason = unplaceable(options, nodes)
        if reason is not None:
            results[i] = cell_result(cell, "error", error=reason)
            continue
        paths = [str(p) for p in cell.inputs()]
        for path in paths:
            if path not in shipped:
                shipped[path] = ray.put(_pack(Path(path)))
        ref = task.options(name=f"infopt {cell.model} {cell.label}", **options).remote(
            cell.args, paths, str(cell.folder), cell.timeout_s, *(shipped[p] for p in paths))
        pending[ref] = (i, cell)
        progress.started(cell, " on Ray")
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        i, cell = pending.pop(ready[0])
        results[i] = _collect(ray, ready[0], cell)
        progress.finished(cell, results[i])


def build_cell(args: list[str], paths: list[str], folder: str, timeout: float, *blobs: bytes) -> dict[str, Any]:
    """On the worker: the cell's inputs unpacked, its build run, its output folder packed."""
    import ray

    work = Path(tempfile.mkdtemp(prefix=f"infopt-cell-{os.getpid()}-"))
    try:
        local = {}
        for n, (path, blob) in enumerate(zip(paths, blobs)):
            local[path] = str(_unpack(blob, work / "in" / str(n)) / Path(path).name)
        out = work / "out" / Path(folder).name
        args = [local.get(a, str(out) if a == folder else a) for a in args]
        run = run_build(args, work, timeout)
        packed = _pack(out, ".") if out.is_dir() and not run.timed_out else None
        return {"run": asdict(run), "folder": packed, "host": socket.gethostname(),
                "node": ray.get_runtime_context().get_node_id()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _collect(ray, ref, cell: Cell) -> CellResult:
    try:
        answer = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the task's own code raised: not a lost worker
        return cell_result(cell, "error", error=f"the Ray task failed: {str(exc).strip().splitlines()[-1]}")
    except ray.exceptions.RayError as exc:  # the worker or its node died, twice
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return cell_result(cell, "error", error=f"the Ray worker building it was lost, and again on the retry "
                                                f"({type(exc).__name__}: {first[:200]})")
    if answer["folder"] is not None:
        try:
            _install(answer["folder"], cell.folder)
        except InfoptError as exc:  # the cell's place holds a folder infopt did not write: left as it is
            return cell_result(cell, "error", error=exc.what)
    return conclude(cell, BuildRun(**answer["run"]), f"{answer['host']} (Ray node {answer['node']})")


def _pack(path: Path, arcname: str | None = None) -> bytes:
    """``path`` as a tar in memory, under its own name (or ``arcname``: ``"."`` for a folder's content)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(path, arcname=path.name if arcname is None else arcname)
    return buffer.getvalue()


def _unpack(blob: bytes, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        # the "data" filter (no absolute paths, no links out) where this Python has it (3.10.12+, 3.11.4+)
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return into


def _install(blob: bytes, folder: Path) -> None:
    """The built folder into its place whole, as a local build puts its output there (staged beside it,
    swapped in, its lock held meanwhile)."""
    with staged_output(folder, force=True) as stage:
        _unpack(blob, stage)


def reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse, at once, a cluster address that is malformed (exit 2) or that nothing answers on
    (exit 4): Ray itself would retry for minutes, printing its own warnings."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray {address}: not a Ray cluster address",
                         fix="pass auto, HOST:PORT (the head node's GCS, port 6379 by default) or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise EnvironmentProblem(f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}",
                                 where="RAY_ADDRESS" if address == os.environ.get("RAY_ADDRESS") else "--ray",
                                 fix="start the cluster (ray start --head) or pass the head node's address; "
                                     "--ray auto starts a Ray on this machine") from None


def _ray():
    try:
        import ray
    except ImportError:
        raise EnvironmentProblem("--ray runs the cells on Ray, which is not installed here",
                                 fix="pip install 'infopt[ray]', or leave out --ray to build in a local pool") from None
    return ray


def _connect(ray, address: str) -> bool:
    """Connect to the Ray the address names (``auto``: ``RAY_ADDRESS``'s or this machine's cluster, else
    a new local one). True when this call connected, so the sweep disconnects at its end (which stops
    a Ray that ``ray.init`` started, and leaves a cluster running)."""
    if ray.is_initialized():
        return False
    named = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    if named and named not in ("auto", "local"):
        reachable(named)
    # a Ray started here runs its workers (and so the builds, whose timings count) at normal priority,
    # not at Ray's default niceness 15; a cluster's own setting stands
    os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        ray.init(address=None if address == "auto" else address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError) as exc:  # reachable, but not a Ray that takes this driver
        raise EnvironmentProblem(f"cannot connect to the Ray cluster at {address}: {str(exc).strip().splitlines()[0]}",
                                 fix="check that the cluster runs the same Ray and Python versions as this machine") from None
    return True
