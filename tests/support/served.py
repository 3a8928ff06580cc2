"""``infopt serve DIST`` as a user runs it: started, asked with the request it prints, stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from tests.support.cli import ROOT

READY_TIMEOUT_S = 180


def triton_missing() -> str | None:
    """Why the bundled Triton server cannot run here (a test skips, saying so), or None."""
    from infopt.core.errors import EnvironmentProblem
    from infopt.runtime.serving.triton_server import bundled

    try:
        bundled()
    except EnvironmentProblem as exc:
        return exc.what
    return None


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free on loopback."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count >= 65535:
            continue
        taken = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                taken.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def serve_and_ask(dist: Path, *args: str) -> tuple[dict, str, int]:
    """Run ``infopt serve DIST ARGS --port P``, send the request it prints, then Ctrl-C it.
    Returns (the answer, everything it printed, its exit code); the server's ports are closed after."""
    port = consecutive_free_ports(6)  # TorchServe: HTTP, management, metrics, two gRPC, the workers' first
    process = subprocess.Popen([sys.executable, "-m", "infopt.cli", "serve", str(dist), *args, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    printed: list[str] = []
    request_line: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in process.stdout:
            printed.append(line)
            if line.startswith("curl ") and not request_line:
                request_line.append(line)
                seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        seen.wait(READY_TIMEOUT_S)
        said = process.stderr.read()[-3000:] if process.poll() is not None else "(running)"
        assert request_line, f"no request was printed; stdout: {''.join(printed)[-2000:]}\nstderr: {said}"
        words = shlex.split(request_line[0])
        url, body = words[words.index("POST") + 1], words[words.index("-d") + 1]
        ask = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(ask, timeout=60) as answer:
            reply = json.loads(answer.read())
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # never leave a server behind: SIGTERM stops it too
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            raise
        reader.join(timeout=10)
    assert not any(listening(p) for p in range(port, port + 3)), "the server still listens after Ctrl-C"
    return reply, "".join(printed) + process.stderr.read(), code


def bounded_load(url: str, model, images, clients: int = 8, seconds: float = 4.0):
    """``clients`` clients for ``seconds`` sending batches of 1, 2 and 4 digit images to ``url`` (the Open
    Inference Protocol's JSON), each answer checked against the eager ``model``."""
    import numpy as np
    import torch

    from infopt.validators.server_load import run_load

    cases = [{"x": np.ascontiguousarray(images[i:i + size])} for i, size in zip(range(0, 96, 8), [1, 2, 4] * 4)]
    with torch.inference_mode():
        expected = [{"output": model(torch.from_numpy(c["x"])).numpy()} for c in cases]
    return run_load(url, cases, expected, clients=clients, seconds=seconds)


def session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes in session ``sid``: a server started in a session of its own and what it started."""
    import contextlib

    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if os.getsid(int(entry)) == sid and state != "Z":
                    found.append(int(entry))
    return found
