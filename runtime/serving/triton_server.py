"""The Triton Inference Server that the ``nvidia-pytriton`` wheel ships, run on a model repository.

``nvidia-pytriton`` 0.7 bundles ``tritonserver`` 2.51 with its Python backend, which runs on a CPU (the
ONNX Runtime and TensorRT backends are not in it): ``pytriton/tritonserver/bin/tritonserver``, the
backends beside it, and one Python backend stub per Python version. :func:`serving` starts it on
loopback ports for a repository written by infopt, waits until the server and every model are ready,
and always stops it, the stubs it started included.

The Python backend runs a model's ``model.py`` in the Python environment that ``python`` on the
server's ``PATH`` belongs to. It exchanges tensors with the server through NumPy, built against
NumPy 1.x, and NumPy 2 breaks that silently: inputs arrive as zeros and outputs leave empty (Triton
lists NumPy 2 as unsupported by the Python backend in its 2.51 and 2.52 releases). So where this
environment has NumPy 2, the server runs the models in :func:`stub_python`: a small environment that
holds NumPy 1.x and reads every other package from this one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from infopt.core.errors import BuildError, EnvironmentProblem

STUB_ENV = "triton-python"
"""the folder, inside this Python environment's own (``sys.prefix``), of the environment the stub runs models in"""
NUMPY_FOR_STUB = "numpy>=1.24,<2"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Bundled:
    """Where the wheel keeps the server: its folder, this Python's backend stub and the libraries they load."""

    root: Path
    stub: Path
    libs: Path

    @property
    def server(self) -> Path:
        return self.root / "bin" / "tritonserver"


def bundled() -> Bundled:
    """The ``tritonserver`` of the installed ``nvidia-pytriton``, or an environment problem saying what to install."""
    fix = "pip install --no-deps nvidia-pytriton==0.7.0 (its own pins would move NumPy below 2 in this environment)"
    found = importlib.util.find_spec("pytriton")  # located, not imported: its Python side is not used
    if found is None or not found.submodule_search_locations:
        raise EnvironmentProblem("the Triton Inference Server binary is not installed: nvidia-pytriton ships it",
                                 fix=fix)
    package = Path(next(iter(found.submodule_search_locations)))
    root = package / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not (root / "bin" / "tritonserver").is_file():
        raise EnvironmentProblem(f"{root} holds no bin/tritonserver", fix=fix)
    if not stub.is_file():
        raise EnvironmentProblem(f"nvidia-pytriton has no Python backend stub for Python {version}",
                                 where=str(stub.parent.parent), fix="run the server from Python 3.8 to 3.13")
    found = Bundled(root, stub, package.parent / "nvidia_pytriton.libs")
    missing = _missing_libraries(found)
    if missing:
        raise EnvironmentProblem(f"the Triton server or its Python backend needs {', '.join(missing)}, which this "
                                 "machine does not have", where=str(root),
                                 fix="install them (libpython: apt-get install libpython3-dev, or the libpython "
                                     f"{version} package of the system)")
    return found


def _missing_libraries(found: Bundled) -> list[str]:
    """Shared libraries the server or the stub cannot find (``ldd``; none listed where ldd is absent)."""
    if shutil.which("ldd") is None:
        return []
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(found.libs), os.environ.get("LD_LIBRARY_PATH")) if p)}
    missing: list[str] = []
    for binary in (found.server, found.stub):
        listed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env).stdout
        missing += [line.split()[0] for line in listed.splitlines() if "not found" in line]
    return sorted(set(missing))


def stub_python(create: bool = True) -> Path:
    """The ``bin`` folder of the Python environment the server's Python backend runs models in.

    This environment's own where its NumPy is 1.x; otherwise ``<sys.prefix>/triton-python``: NumPy 1.x,
    and a ``.pth`` line that adds this environment's packages after it (torch, and whatever the models
    import). ``create`` makes it when it is missing (``pip`` fetches NumPy once)."""
    import numpy

    if int(numpy.__version__.split(".")[0]) < 2:
        return Path(sys.executable).parent
    env = Path(sys.prefix) / STUB_ENV
    bin_dir = env / "bin"
    if (bin_dir / "python").exists() and (_site_packages(env) / "infopt-packages.pth").is_file():
        return bin_dir
    if not create:
        raise EnvironmentProblem(f"no Python environment with NumPy 1.x for Triton's Python backend at {env}",
                                 fix="call infopt.runtime.serving.triton_server.stub_python() once (it runs pip)")
    staging = env.with_name(f".{STUB_ENV}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(staging)], check=True, capture_output=True)
        site = _site_packages(staging)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site),
                        NUMPY_FOR_STUB], check=True, capture_output=True, text=True,
                       env={**os.environ, "PIP_CONSTRAINT": ""})
        (site / "infopt-packages.pth").write_text(
            f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        shutil.rmtree(env, ignore_errors=True)
        staging.rename(env)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        said = (exc.stderr or "").strip().splitlines()
        raise EnvironmentProblem(f"could not make the NumPy 1.x environment Triton's Python backend needs: "
                                 f"{said[-1] if said else exc}", where=str(env),
                                 fix=f"pip must reach a package index for {NUMPY_FOR_STUB!r}") from None
    return bin_dir


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


@dataclass(frozen=True)
class Endpoints:
    """A running server: its HTTP and gRPC addresses (``host:port``, as ``tritonclient`` takes them) and its log."""

    http: str
    grpc: str
    log: Path
    process: subprocess.Popen
    repository: Path

    def statistics(self, model: str) -> dict:
        import json

        with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/stats", timeout=10) as answer:
            return json.loads(answer.read())


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextlib.contextmanager
def serving(repository: Path, workdir: Path, *, ready_timeout_s: float = READY_TIMEOUT_S,
            verbose: bool = False, first_http_port: int | None = None) -> Iterator[Endpoints]:
    """``tritonserver`` on ``repository``, on free loopback ports (or HTTP on ``first_http_port``, gRPC and
    metrics on the two after it), its backends and log in ``workdir`` (``verbose``: the server's own
    verbose log, which names each warm-up run).

    Yields once the server and every model in the repository are ready; a model that fails to load is an
    error with the server's log. On the way out the server and the stubs it started are stopped (SIGTERM,
    then SIGKILL to the whole process group)."""
    found = bundled()
    repository, workdir = Path(repository).resolve(), Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    backends = workdir / "backends"
    shutil.rmtree(backends, ignore_errors=True)
    shutil.copytree(found.root / "backends", backends)
    shutil.copy2(found.stub, backends / "python" / "triton_python_backend_stub")
    http, grpc, metrics = range(first_http_port, first_http_port + 3) if first_http_port else free_ports(3)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(found.libs), env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join((str(stub_python()), env.get("PATH", "")))
    log = workdir / "tritonserver.log"
    command = [str(found.server), f"--model-repository={repository}", f"--backend-directory={backends}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", f"--http-port={http}",
               f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--allow-metrics=false",
               "--exit-on-error=true", "--strict-readiness=true", f"--log-verbose={int(verbose)}"]
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        _wait_ready(process, f"127.0.0.1:{http}", log, ready_timeout_s)
        yield Endpoints(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", log, process, repository)
    finally:
        stop(process)


def _wait_ready(process: subprocess.Popen, http: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BuildError(f"tritonserver exited with {process.returncode} before it was ready",
                             where=str(log), fix=f"read the server's log; it ends:\n{log_tail(log)}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        time.sleep(0.3)
    raise BuildError(f"tritonserver was not ready after {timeout_s:.0f} s", where=str(log),
                     fix=f"read the server's log; it ends:\n{log_tail(log)}")


def stop(process: subprocess.Popen) -> None:
    """Stop the server and everything in its process group (the Python backend's stubs): SIGTERM to the
    server alone, which unloads its models and ends their stubs (about 2 s; a SIGTERM to the whole group
    would end the stubs first and leave the server waiting out its exit timeout), then SIGKILL to
    whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT_S)


def log_tail(log: Path, chars: int = 2000) -> str:
    """The end of a server's log, for an error message."""
    return log.read_text(errors="replace")[-chars:] if log.is_file() else f"({log.name} was not written)"
