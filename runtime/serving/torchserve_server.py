"""A real TorchServe on a build's ``servers/torchserve/`` folder, on loopback, always stopped.

The folder's own ``config.properties`` is used with its ports moved (to free ones, or from a given
HTTP port up), written into the work folder; the server's pid file, temporary files and logs stay in
the work folder too. TorchServe's frontend is a Java program, so Java 17 must be installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from infopt.core.errors import BuildError, EnvironmentProblem
from infopt.runtime.serving.triton_server import free_ports, log_tail

READY_TIMEOUT_S = 120.0
ADDRESSES = ("inference_address", "management_address", "metrics_address")
PORTS = ("grpc_inference_port", "grpc_management_port", "initial_worker_port")
"""set where the config has them, added where not: the workers' port names their Unix sockets
(``<java.io.tmpdir>/.ts.sock.<port>``), so two servers left at the default 9000 take each other's socket"""


@dataclass(frozen=True)
class TorchServeEndpoints:
    inference: str
    """``http://127.0.0.1:PORT``: ``POST /predictions/<name>``"""
    management: str
    logs: Path
    process: subprocess.Popen


def torchserve_command() -> Path:
    """The ``torchserve`` launcher beside this Python, or an environment problem saying what is missing."""
    found = Path(sys.executable).with_name("torchserve")
    if not found.exists():
        which = shutil.which("torchserve")
        if which is None:
            raise EnvironmentProblem("torchserve is not installed", fix="pip install torchserve torch-model-archiver")
        found = Path(which)
    if shutil.which("java") is None:
        raise EnvironmentProblem("java is not installed: TorchServe's frontend is a Java program",
                                 fix="install a Java 17 runtime (e.g. apt-get install openjdk-17-jre-headless)")
    return found


def moved_ports(config: str, first_http_port: int | None = None) -> tuple[str, dict[str, int]]:
    """``config`` (a ``config.properties``) with every listening port replaced: from ``first_http_port``
    up (inference, management, metrics, the gRPC ports, then the workers' first port), or free ones. Returns the
    text and the ports."""
    keys = [*ADDRESSES, *PORTS]
    ports = list(range(first_http_port, first_http_port + len(keys))) if first_http_port else free_ports(len(keys))
    chosen = dict(zip(keys, ports))
    for key in ADDRESSES:
        config, found = re.subn(rf"^({key}=https?://[^:\s]+:)\d+\s*$", rf"\g<1>{chosen[key]}", config, flags=re.M)
        if not found:
            raise BuildError(f"config.properties has no {key}", fix="rebuild the output folder, or restore its config.properties")
    for key in PORTS:
        config, found = re.subn(rf"^{key}=\d+\s*$", f"{key}={chosen[key]}", config, flags=re.M)
        if not found:
            config = config.rstrip("\n") + f"\n{key}={chosen[key]}\n"
    return config, chosen


@contextlib.contextmanager
def serving(folder: Path, name: str, workdir: Path, *, first_http_port: int | None = None,
            ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[TorchServeEndpoints]:
    """TorchServe on ``folder`` (``config.properties`` and ``model-store/<name>.mar``), once ``name``'s worker
    is ready; on the way out ``torchserve --stop``, then SIGKILL to whatever of its session is left."""
    command = torchserve_command()
    folder, workdir = Path(folder).resolve(), Path(workdir).resolve()
    text, ports = moved_ports((folder / "config.properties").read_text(), first_http_port)
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.properties"
    config.write_text(text)
    private, logs, output = workdir / "tmp", workdir / "logs", workdir / "torchserve.out"
    private.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(private), "TEMP": str(private), "LOG_LOCATION": str(logs),
           "METRICS_LOCATION": str(logs)}
    with open(output, "wb") as sink:
        process = subprocess.Popen([str(command), "--start", "--foreground", "--ncs", "--ts-config", str(config)],
                                   cwd=folder, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    management = f"http://127.0.0.1:{ports['management_address']}"
    try:
        _wait_ready(process, management, name, output, logs, ready_timeout_s)
        yield TorchServeEndpoints(f"http://127.0.0.1:{ports['inference_address']}", management, logs, process)
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run([str(command), "--stop", "--foreground"], cwd=folder, env=env, capture_output=True, timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def _wait_ready(process, management: str, name: str, output: Path, logs: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BuildError(f"torchserve exited with {process.returncode} before {name} was ready", where=str(output),
                             fix=f"read its output; it ends:\n{log_tail(output)}")
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            with urllib.request.urlopen(f"{management}/models/{name}", timeout=5) as answer:
                described = json.loads(answer.read())
                if described and described[0]["workers"] and described[0]["workers"][0]["status"] == "READY":
                    return
        time.sleep(0.5)
    raise BuildError(f"{name} was not ready in TorchServe after {timeout_s:.0f} s", where=str(logs),
                     fix=f"read the worker's log; it ends:\n{log_tail(logs / 'model_log.log')}")

