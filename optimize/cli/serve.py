"""``infopt serve DIST``: the real server on an output folder, on loopback, until Ctrl-C.

Triton (the ``tritonserver`` binary ``nvidia-pytriton`` ships: its Python backend serves an
AOTInductor ``model.pt2``, and a text-generation build's GenAI folder on the generate endpoint; it has no
ONNX Runtime or TensorRT backend) or TorchServe (the ``servers/torchserve/`` archive: ONNX Runtime or a
``.pt2``; Java 17). ``--server auto`` takes Triton where it can serve the model and TorchServe otherwise.
An output neither can serve here is exit 2 (a text-generation build asked of TorchServe, a server folder
the build did not write) or 4 (what this machine lacks). Once the model is ready the command prints the
endpoint and a request that works, then waits; Ctrl-C (or SIGTERM) stops the server and everything it
started, and the command exits 0.
"""

from __future__ import annotations

import json
import shlex
import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from infopt.cli.output import stdout

MAX_EXAMPLE_VALUES = 4096
"""inputs up to this many values are written out in the example request; larger ones name their shape"""
TRITON_DTYPES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "int64": "INT64", "int32": "INT32",
                 "bool": "BOOL", "uint8": "UINT8", "int8": "INT8", "float64": "FP64"}


def serve(
    dist: Annotated[Path, typer.Argument(help="An output folder written by `infopt build`.")],
    server: Annotated[str, typer.Option("--server", help="triton, torchserve, or auto (Triton where the bundled "
                                                         "binary can serve the model, else TorchServe).")] = "auto",
    port: Annotated[Optional[int], typer.Option("--port", min=1, max=65530,
                                                help="HTTP port (the server's other ports follow it); default: Triton "
                                                     "8000, TorchServe 8080.")] = None,
    key: Annotated[Optional[Path], typer.Option("--key", help="Ed25519 public key (PEM): serve only if "
                                                              "manifest.json.sig verifies with it.")] = None,
) -> None:
    """Serve an output folder with the real server on 127.0.0.1 until Ctrl-C, once its files match its manifest."""
    from infopt.core.errors import EnvironmentProblem, UsageError
    from infopt.core.manifest import read_manifest
    from infopt.core.work_folders import work_folder

    if server not in ("auto", "triton", "torchserve"):
        raise UsageError(f"--server {server!r} is not a server infopt starts", fix="use triton, torchserve or auto")
    if not (dist / "manifest.json").is_file():
        raise UsageError(f"{dist} is not an output folder of infopt (no manifest.json)", fix="pass the folder `infopt build` wrote")
    manifest = read_manifest(dist)
    _check_sealed(dist, manifest, key)
    model = Path(manifest.artifacts.model)
    generates = "onnxruntime-genai" in manifest.artifacts
    chosen = "triton" if generates and server == "auto" else _choose(server, model.suffix, dist)
    if generates and chosen != "triton":
        raise UsageError(f"{dist} is a text-generation build, which TorchServe does not serve here",
                         fix="use --server triton (or leave --server out): Triton's generate endpoint serves it")
    folder = dist / "servers" / chosen
    if not folder.is_dir():
        raise UsageError(f"{dist} holds no servers/{chosen}/: its build wrote no {chosen} deployable",
                         where=str(dist), fix="rebuild it with this infopt, or serve it with the other --server")
    if chosen == "triton" and model.suffix != ".pt2" and not generates:
        raise EnvironmentProblem(f"the Triton binary here (nvidia-pytriton's) has no backend for {model.name}: it serves "
                                 "AOTInductor packages through its Python backend only",
                                 fix=f"use --server torchserve, or serve {dist / 'servers' / 'triton'} with NVIDIA's Triton "
                                     "container (tritonserver --model-repository=...)")
    first_port = port or (8000 if chosen == "triton" else 8080)
    _check_ports_free(first_port, given=port is not None)
    with work_folder("serve") as work:
        if chosen == "triton":
            from infopt.runtime.serving.triton_server import serving

            context = serving(dist / "servers" / "triton", Path(work), first_http_port=first_port)
        else:
            from infopt.runtime.serving.torchserve_server import serving

            context = serving(dist / "servers" / "torchserve", manifest.name, Path(work), first_http_port=first_port)
        with context as endpoints:
            if chosen == "triton":
                url = f"http://{endpoints.http}/v2/models/{manifest.name}/{'generate' if generates else 'infer'}"
                where = f"Triton Inference Server on http://{endpoints.http} (gRPC {endpoints.grpc})"
            else:
                url = f"{endpoints.inference}/predictions/{manifest.name}"
                where = f"TorchServe on {endpoints.inference} (management {endpoints.management})"
            say = _say_ready_to_generate if generates else _say_ready
            handlers = _wait(endpoints.process, lambda: say(manifest, where, url))
            stdout().print("stopping the server", markup=False)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    stdout().print("stopped; the server and everything it started have exited", markup=False)


def _check_sealed(dist: Path, manifest, key: Optional[Path]) -> None:
    """Exit 1, starting nothing, where a file the manifest lists is changed or missing (as ``infopt verify`` finds
    them) or, with ``key``, the signature does not verify: a server must serve what the build validated. Files
    the manifest does not list are let be: the servers write their own beside the model (Triton's Python backend
    its ``__pycache__``), so a second ``serve`` of the same folder must not refuse it."""
    from infopt.api.signing import check_signature
    from infopt.core.errors import IntegrityError, ValidationFailed
    from infopt.core.manifest import verify_files

    problems = verify_files(dist, manifest.files)
    if problems:
        raise ValidationFailed(f"{dist} does not match its manifest, so nothing was started: " + "; ".join(problems),
                               where=str(dist / "manifest.json"),
                               fix=f"rebuild it or restore its files; `infopt verify {dist}` lists every file")
    if key is not None:
        try:
            check_signature(dist, key)
        except IntegrityError as exc:
            raise ValidationFailed(f"{exc.what}, so nothing was started", where=exc.where, fix=exc.fix) from None


PORTS = 3
"""ports each server takes from the first: HTTP, then gRPC and metrics (Triton) or management and metrics
(TorchServe)"""


def _check_ports_free(first: int, given: bool) -> None:
    """Exit 2, starting nothing, where a port the server needs is taken on 127.0.0.1, naming a first port whose
    ``PORTS`` ports are free."""
    import socket

    from infopt.core.errors import UsageError

    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    taken = next((p for p in range(first, first + PORTS) if not free(p)), None)
    if taken is None:
        return
    other = next((p for p in range(first + PORTS, 65530 - PORTS, PORTS)
                  if all(free(q) for q in range(p, p + PORTS))), None)
    raise UsageError(f"port {taken} is in use on 127.0.0.1" + ("" if given else " (the default)")
                     + f": the server needs ports {first}-{first + PORTS - 1}",
                     fix=(f"pass --port {other}" if other else "pass --port with a free port")
                         + ", or stop what listens there")


def _choose(server: str, suffix: str, dist: Path) -> str:
    if server != "auto":
        return server
    if suffix == ".pt2" and (dist / "servers" / "triton").is_dir():
        from infopt.core.errors import EnvironmentProblem
        from infopt.runtime.serving.triton_server import bundled

        try:
            bundled()
            return "triton"
        except EnvironmentProblem:
            pass
    return "torchserve"


def example_body(manifest) -> dict:
    """The Open Inference Protocol request body both servers take: each input at batch 1, its other
    dims at their opt size, filled with zeros (the ids of a text model: token 0)."""
    dims = manifest.inputs.dims
    body = []
    for tensor in manifest.inputs.inputs:
        shape = [d if isinstance(d, int) else (1 if i == 0 else dims[d].opt) for i, d in enumerate(tensor.shape)]
        count = 1
        for d in shape:
            count *= d
        zero = 0.0 if tensor.dtype.startswith(("float", "bfloat")) else 0
        body.append({"name": tensor.name, "shape": shape, "datatype": TRITON_DTYPES.get(tensor.dtype, tensor.dtype.upper()),
                     "data": [zero] * count})
    return {"inputs": body}


def _say_ready(manifest, where: str, url: str) -> None:
    console = stdout()
    body = example_body(manifest)
    console.print(f"serving {manifest.name} with {where}; Ctrl-C stops it", markup=False)
    if sum(len(t["data"]) for t in body["inputs"]) <= MAX_EXAMPLE_VALUES:
        text = json.dumps(body, separators=(",", ":"))
        console.print("a request:", markup=False)
        console.print(f"curl -s -X POST {url} -H 'Content-Type: application/json' -d {shlex.quote(text)}",
                      markup=False, soft_wrap=True)
    else:
        shapes = ", ".join(f"{t['name']} {t['datatype']}{t['shape']}" for t in body["inputs"])
        console.print(f"POST {url} a JSON body {{\"inputs\": [{{\"name\", \"shape\", \"datatype\", \"data\"}}]}} "
                      f"with {shapes}", markup=False, soft_wrap=True)


GENERATE_EXAMPLE = {"text_input": "Once upon a time", "max_tokens": 16}
"""the request printed for a text-generation build: Triton's generate endpoint maps its fields to the model's inputs"""


def _say_ready_to_generate(manifest, where: str, url: str) -> None:
    console = stdout()
    console.print(f"serving {manifest.name} with {where}; Ctrl-C stops it", markup=False)
    console.print("a request (add \"stream\": true and POST to .../generate_stream for one event per token):",
                  markup=False)
    text = json.dumps(GENERATE_EXAMPLE, separators=(",", ":"))
    console.print(f"curl -s -X POST {url} -H 'Content-Type: application/json' -d {shlex.quote(text)}", markup=False,
                  soft_wrap=True)


def _wait(process, announce) -> dict:
    """``announce()`` (the ready message), then wait until Ctrl-C or SIGTERM (then further ones are ignored until
    the caller restores the handlers it gets back: a second Ctrl-C while the server stops must not leave it running
    without this process), or the server exits on its own (an error: exit 3). The handlers are set before the
    message, so a Ctrl-C sent as soon as it is read stops the server cleanly rather than ending as an interrupted
    build (exit 130)."""
    from infopt.core.errors import BuildError

    signals = (signal.SIGINT, signal.SIGTERM)

    def stop(signum, frame):
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    # both set here: a process started with SIGINT ignored (a background job of a script, a test worker)
    # would otherwise not stop on Ctrl-C
    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        announce()
        while process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        return previous
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    raise BuildError(f"the server exited on its own with {process.returncode}", fix="see its log in the messages above")
