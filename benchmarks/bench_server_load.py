"""Question: what do the real servers give under load, next to the build's own latency-versus-batch curve?

The trained digits CNN is built twice: with ``--backend inductor`` (served by the Triton Inference
Server binary ``nvidia-pytriton`` ships, Python backend) and with ``--backend onnxruntime`` (served by
TorchServe). Each server is started by infopt's launcher (what ``infopt serve`` runs) on loopback, and
``infopt.validators.server_load.run_load`` drives it: N clients, each sending single images one after
another for T seconds, every answer checked against the eager model. The table gives the clients'
p50/p99 and throughput beside the build's own p50 at batch 1 and 4 (``validation.curve`` in the
manifest: the model alone, no server).

    python benchmarks/bench_server_load.py [--seconds 10] [--clients 1,4,16] [--markdown benchmarks/results/server_load.md]
    python benchmarks/bench_server_load.py --quick      # 3 s per row, no results file
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import infopt  # noqa: E402
from benchmarks.common import RESULTS, environment, publish  # noqa: E402
from examples.train import train_digits  # noqa: E402
from infopt.core.manifest import read_manifest  # noqa: E402
from infopt.runtime.serving import torchserve_server, triton_server  # noqa: E402
from infopt.validators.server_load import run_load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--quick", action="store_true", help="3 s per row, no results file")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    markdown = None if args.quick else (args.markdown or RESULTS / "server_load.md")
    clients = [int(c) for c in args.clients.split(",")]

    model, data = train_digits()
    images = data["val"][0]
    cases = [{"x": np.ascontiguousarray(images[i:i + 1])} for i in range(64)]
    with torch.inference_mode():
        expected = [{"output": model(torch.from_numpy(c["x"])).numpy()} for c in cases]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-server-load-") as tmp:
        work = Path(tmp)
        for backend, server in (("inductor", "triton"), ("onnxruntime", "torchserve")):
            dist = work / backend
            infopt.build(model, example_inputs=(torch.from_numpy(images[:2]),), backend=backend, name="digits",
                         output=dist, progress=False)
            curve = {row["batch"]: row["p50_ms"] for row in read_manifest(dist).validation.curve}
            if server == "triton":
                context = triton_server.serving(dist / "servers" / "triton", work / "triton-run")
            else:
                context = torchserve_server.serving(dist / "servers" / "torchserve", "digits", work / "torchserve-run")
            with context as endpoints:
                url = (f"http://{endpoints.http}/v2/models/digits/infer" if server == "triton"
                       else f"{endpoints.inference}/predictions/digits")
                run_load(url, cases, expected, clients=2, seconds=1.0)  # warm the server's connection handling
                for n in clients:
                    result = run_load(url, cases, expected, clients=n, seconds=seconds)
                    rows.append((server, backend, result, curve))
                    print(f"{server} {n} clients: {result.requests} requests, {result.failed} failed, {result.wrong} wrong, "
                          f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, {result.throughput:.0f} req/s", flush=True)
    lines = ["# Servers under load: the digits CNN, single-image requests, every answer checked", "",
             f"{seconds:.0f} s per row; measured {datetime.date.today().isoformat()}.", "",
             "| server (model) | clients | requests | failed | wrong | p50 ms | p90 ms | p99 ms | requests/s | "
             "build curve p50 ms, batch 1 | batch 4 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for server, backend, r, curve in rows:
        lines.append(f"| {server} ({'model.pt2' if backend == 'inductor' else 'model.onnx'}) | {r.clients} | {r.requests} | "
                     f"{r.failed} | {r.wrong} | {r.p50_ms:.2f} | {r.p90_ms:.2f} | {r.p99_ms:.2f} | {r.throughput:.0f} | "
                     f"{curve.get(1, float('nan')):.3f} | {curve.get(4, float('nan')):.3f} |")
    lines += ["", *(f"- {line}" for line in environment())]
    publish("\n".join(lines), markdown)


if __name__ == "__main__":
    main()
