"""A bounded load on a running server: N clients for T seconds, every answer checked.

Each client sends requests one after another, each with one of a fixed set of inputs whose expected
outputs are known (the eager model's), and compares the answer within a tolerance. Requests go over
HTTP as the Open Inference Protocol's JSON (``{"inputs": [{"name", "shape", "datatype", "data"}]}``),
which Triton's ``/v2/models/<name>/infer`` and infopt's TorchServe handler both take, so one client
loads either server. The result counts requests, failed ones (an HTTP error, a timeout, a malformed
answer) and wrong ones (an answer that differs from the expected), with the latency percentiles and
the throughput the clients saw.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float16): "FP16", np.dtype(np.int64): "INT64",
             np.dtype(np.int32): "INT32", np.dtype(np.float64): "FP64", np.dtype(np.bool_): "BOOL"}
KEPT_ERRORS = 5


@dataclass
class LoadResult:
    clients: int
    seconds: float
    requests: int
    failed: int
    wrong: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    throughput: float
    """answered requests per second, over the whole run"""
    errors: list[str] = field(default_factory=list)
    """the first few failures and wrong answers, as said"""

    def to_json(self) -> dict:
        return asdict(self)


def post_json(url: str, inputs: dict[str, np.ndarray], timeout: float = 30.0) -> dict[str, np.ndarray]:
    """One Open Inference Protocol request; the outputs by name (raises on an HTTP error)."""
    body = {"inputs": [{"name": name, "shape": list(value.shape), "datatype": DATATYPES[value.dtype],
                        "data": value.ravel().tolist()} for name, value in inputs.items()]}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        reply = json.loads(answer.read())
    return {o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"]) for o in reply["outputs"]}


def run_load(url: str, cases: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]], *, clients: int,
             seconds: float, atol: float = 1e-4, send: Callable[[str, dict], dict] = post_json) -> LoadResult:
    """``clients`` threads, each sending the cases in turn (starting at its own offset) for ``seconds``."""
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"requests": 0, "failed": 0, "wrong": 0}
    errors: list[str] = []
    deadline = time.perf_counter() + seconds

    def note(kind: str, text: str) -> None:
        with lock:
            counts[kind] += 1
            if len(errors) < KEPT_ERRORS:
                errors.append(text)

    def client(offset: int) -> None:
        i = offset
        while time.perf_counter() < deadline:
            case = i % len(cases)
            i += 1
            start = time.perf_counter()
            try:
                got = send(url, cases[case])
            except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
                note("failed", f"case {case}: {type(exc).__name__}: {exc}")
                continue
            took = time.perf_counter() - start
            with lock:
                counts["requests"] += 1
                latencies.append(took)
            for name, want in expected[case].items():
                have = got.get(name)
                if have is None or have.shape != want.shape or not np.allclose(have, want, atol=atol, rtol=1e-4):
                    note("wrong", f"case {case}: output {name} differs from the expected")
                    break

    began = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k * 7,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    ms = np.asarray(latencies) * 1e3 if latencies else np.zeros(1)
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return LoadResult(clients, round(elapsed, 3), counts["requests"], counts["failed"], counts["wrong"], p50, p90, p99,
                      counts["requests"] / elapsed if elapsed > 0 else 0.0, errors)
