"""TorchServe model store: ``<folder>/model-store/<name>.mar`` and ``<folder>/config.properties``.

The archive is built by torch-model-archiver (run as ``python -m model_archiver.model_packaging``
in a private temporary folder, since the archiver stages its files in ``$TMPDIR/<model name>`` and
deletes whatever is there first). It holds, at its root::

    infopt_handler.py       the handler: one class, ``InfoptHandler``, needing numpy and
                            onnxruntime (ONNX) or torch (AOTInductor) but not infopt
    model.onnx              the model file under its own name (``model.pt2`` for AOTInductor),
    model.onnx.data         beside its external-data sidecar when it has one
    infopt_io.json          input and output names, dtypes and shapes, the batch dim
    model-config.yaml       workers, server-side batching (``batchSize``, ``maxBatchDelay``)
    MAR-INF/MANIFEST.json   written by the archiver; names the handler and the model file

The model file's suffix picks the runtime: ``.onnx`` runs in an ONNX Runtime session (the CUDA
execution provider on the worker's GPU when the target is CUDA and the server has it), ``.pt2``
through ``torch._inductor.aoti_load_package`` on the device it was compiled for. A TensorRT
``.plan`` is not offered: serve it with Triton.

Requests are JSON, the batch dim included::

    POST /predictions/<name>   {"inputs": {"x": [[...]]}}
    ->                         {"outputs": {"output": [[...]]}}

KServe v2-style bodies (``{"inputs": [{"name", "shape", "datatype", "data"}]}``) are answered in
kind (``{"model_name", "outputs": [{"name", "shape", "datatype", "data"}]}``, data flattened).
When every input and output leads with the same dynamic batch dim, TorchServe batches requests
on the server and the handler runs each group of requests with equal non-batch dims as one call,
in chunks of at most the batch dim's max. A request that cannot run (not JSON, a missing or unknown
input, a wrong dtype or shape) is answered with status 400 and ``{"error": "..."}`` naming the
problem; the other requests in its batch are unaffected.

``config.properties`` binds the inference, management and metrics APIs and gRPC to 127.0.0.1 on
TorchServe's default ports (8080, 8081, 8082; 7070, 7071), loads ``<name>.mar`` from the
``model-store`` folder beside it and turns token authorization (on by default since TorchServe
0.12) off, which is safe only on loopback. Start the server from that folder::

    cd dist/<name>/servers/torchserve && torchserve --start --ncs --ts-config config.properties
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

from infopt.core.errors import BuildError, EnvironmentProblem, UsageError
from infopt.core.inputspec import InputSpec
from infopt.core.manifest_schema import Manifest
from infopt.core.work_folders import work_folder
from infopt.exporters.servers.emitter import EmitJob, ServerEmitter, register

HANDLER_FILE = "infopt_handler.py"
IO_FILE = "infopt_io.json"
MODEL_CONFIG_FILE = "model-config.yaml"
MODEL_VERSION = "1.0"
MAX_BATCH_REQUESTS = 8
"""Requests TorchServe gathers into one handler call (``batchSize``); each may hold several rows."""
MAX_BATCH_DELAY_MS = 5
"""How long TorchServe waits to fill a batch (``maxBatchDelay``)."""
RESPONSE_TIMEOUT_S = 120
DEFAULT_PORTS = {"inference": 8080, "management": 8081, "metrics": 8082, "grpc_inference": 7070, "grpc_management": 7071}
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
"""The model names torch-model-archiver accepts."""

HANDLER = (files("infopt.exporters.servers") / "programs" / "torchserve_handler.py").read_text()
"""The program shipped beside the model, kept as a real file (``programs/torchserve_handler.py``) so it is linted and tested."""


def io_description(name: str, model_file: Path, manifest: Manifest) -> dict[str, Any]:
    """What the handler reads from ``infopt_io.json``: names, dtypes, shapes, dims and the batch dim.

    ``batch`` is the symbol leading every input and output (null when there is none, and then
    requests are never joined); ``max_batch`` is its max, the most rows run in one call."""
    spec = InputSpec.from_json(manifest.inputs.model_dump())
    outputs = [{"name": o.name, "dtype": o.dtype, "shape": list(o.shape)} for o in manifest.outputs]
    batch = spec.batch_symbol
    if batch is not None and not all(o["shape"] and o["shape"][0] == batch for o in outputs):
        batch = None
    device = manifest.target.device
    return {
        "name": name,
        "model_file": model_file.name,
        "format": "aoti" if model_file.suffix == ".pt2" else "onnx",
        "device": device,
        "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in spec.inputs],
        "outputs": outputs,
        "dims": {k: {"min": v.min, "opt": v.opt, "max": v.max} for k, v in spec.dims.items()},
        "batch": batch,
        "max_batch": spec.dims[batch].max if batch is not None and batch in spec.dims else None,
    }


def model_config_yaml(batched: bool) -> str:
    """Per-model settings in the archive: one worker, and server-side batching when batched."""
    lines = ["minWorkers: 1", "maxWorkers: 1", f"batchSize: {MAX_BATCH_REQUESTS if batched else 1}",
             f"maxBatchDelay: {MAX_BATCH_DELAY_MS if batched else 0}", f"responseTimeout: {RESPONSE_TIMEOUT_S}"]
    return "\n".join(lines) + "\n"


def config_properties(name: str, host: str = "127.0.0.1", ports: dict[str, int] | None = None) -> str:
    """The server configuration: APIs on ``host``, the store in ``model-store``, ``<name>.mar`` loaded.

    ``ports`` overrides entries of ``DEFAULT_PORTS`` (inference, management, metrics,
    grpc_inference, grpc_management)."""
    port = {**DEFAULT_PORTS, **(ports or {})}
    lines = [
        f"# TorchServe configuration for {name}; start the server from this folder:",
        "#   torchserve --start --ncs --ts-config config.properties",
        f"inference_address=http://{host}:{port['inference']}",
        f"management_address=http://{host}:{port['management']}",
        f"metrics_address=http://{host}:{port['metrics']}",
        f"grpc_inference_address={host}",
        f"grpc_inference_port={port['grpc_inference']}",
        f"grpc_management_address={host}",
        f"grpc_management_port={port['grpc_management']}",
        "model_store=model-store",
        f"load_models={name}.mar",
        "default_workers_per_model=1",
        "# token authorization is on by default since 0.12; the APIs above listen on loopback only",
        "disable_token_authorization=true",
        "enable_model_api=false",
        "install_py_dep_per_model=false",
    ]
    return "\n".join(lines) + "\n"


def _check_archiver() -> None:
    try:
        import model_archiver  # noqa: F401 - only whether it is installed
    except ImportError as exc:
        raise EnvironmentProblem("torch-model-archiver is not installed, so the TorchServe archive cannot be built",
                                 where=sys.executable, fix="pip install torch-model-archiver") from exc


def _archive(work: Path, name: str, model_file: Path, extra: list[Path], store: Path) -> Path:
    """Run torch-model-archiver; it stages its files in ``work/staging/<name>``, not the shared temp folder.

    The archive stores its files uncompressed (``zip-store``, still a ``.mar`` TorchServe reads): weights hardly
    compress (a few per cent), and deflating them took 56 s for a 1.3 GB model, most of its build's emit step.

    ``extra`` are paths inside ``work``: the archiver splits ``--extra-files`` on commas and expands
    ``*?[]`` in it, so files from elsewhere are linked in under a plain name first."""
    command = [sys.executable, "-m", "model_archiver.model_packaging",
               "--model-name", name, "--version", MODEL_VERSION,
               "--handler", str(work / HANDLER_FILE), "--serialized-file", str(model_file),
               "--extra-files", ",".join(str(p) for p in extra),
               "--config-file", str(work / MODEL_CONFIG_FILE),
               "--export-path", str(store), "--archive-format", "zip-store", "--force"]
    staging = work / "staging"
    staging.mkdir()
    env = {**os.environ, "TMPDIR": str(staging), "TEMP": str(staging), "TMP": str(staging)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=work)
    mar = store / f"{name}.mar"
    if done.returncode != 0 or not mar.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise BuildError(f"torch-model-archiver failed for {model_file.name} (exit {done.returncode}): {tail}",
                         where=str(model_file), fix="check that torch-model-archiver runs: torch-model-archiver --help")
    return mar


def write_torchserve(folder: Path, name: str, model_file: Path, manifest: Manifest) -> Path:
    """Write ``folder/model-store/<name>.mar`` and ``folder/config.properties``; returns the archive.

    ``model_file`` is the built ``.onnx`` (with its ``<file>.data`` sidecar beside it, if any) or
    ``.pt2``; ``manifest`` supplies ``inputs``, ``outputs`` and ``target.device``."""
    folder, model_file = Path(folder), Path(model_file)
    if model_file.suffix == ".plan":
        raise UsageError("TorchServe is not offered for TensorRT plans", where=str(model_file),
                         fix="serve the plan with Triton (servers/triton), or build with --backend onnxruntime or inductor")
    if model_file.suffix not in (".onnx", ".pt2"):
        raise UsageError(f"TorchServe cannot serve {model_file.name}", where=str(model_file),
                         fix="give an .onnx or .pt2 (AOTInductor) model")
    if not MODEL_NAME_RE.match(name):
        raise UsageError(f"{name!r} is not a TorchServe model name", where="write_torchserve",
                         fix="use letters, digits, '_', '-' and '.', starting with a letter or digit")
    if not model_file.is_file():
        raise UsageError(f"model file {model_file} does not exist", fix="pass the built model file")
    _check_archiver()
    io = io_description(name, model_file, manifest)
    store = folder / "model-store"
    store.mkdir(parents=True, exist_ok=True)
    with work_folder("torchserve") as tmp:
        work = Path(tmp)
        (work / HANDLER_FILE).write_text(HANDLER)
        (work / IO_FILE).write_text(json.dumps(io, indent=2) + "\n")
        (work / MODEL_CONFIG_FILE).write_text(model_config_yaml(io["batch"] is not None))
        extra = [work / IO_FILE]
        sidecar = model_file.with_name(model_file.name + ".data")
        if model_file.suffix == ".onnx" and sidecar.is_file():
            (work / sidecar.name).symlink_to(sidecar.resolve())
            extra.append(work / sidecar.name)
        mar = _archive(work, name, model_file, extra, store)
    (folder / "config.properties").write_text(config_properties(name))
    return mar


__all__ = ["write_torchserve", "config_properties", "io_description", "HANDLER"]


def emit(job: EmitJob) -> Path:
    write_torchserve(job.stage / "servers" / "torchserve", job.name, job.staged_model, job.manifest)
    return job.stage / "servers" / "torchserve"


SERVES = {
    "onnx": "a handler running an ONNX Runtime session",
    "aoti": "a handler loading the AOTInductor package",
}
"""the representations this server serves, and how"""

EMITTER = register(ServerEmitter("torchserve", 20, emit, SERVES))
