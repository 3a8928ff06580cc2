"""Do builds survive candidates that crash? The digits CNN is built from the command line (in this process,
through the CLI's entry point) with its AOTInductor runner replaced, for each way native code dies, by one that
does so in the worker process that runs it (``tests/support/crashing_runners.py``): a segmentation fault on the first
run, abort() while loading, and the SIGKILL the kernel's OOM killer sends. Each is built ``--rounds`` times with
``--backend auto`` (the others must ship, every file matching the manifest) and with ``--backend inductor``
alone (exit 3, nothing written).

    python benchmarks/crash_builds.py [--rounds 3] [--markdown benchmarks/results/crash_builds.md]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.common import RESULTS, environment, publish  # noqa: E402
from infopt.core.manifest import read_manifest, verify_files  # noqa: E402
from infopt.runtime import backend as backend_registry  # noqa: E402
from infopt.runtime import backends  # noqa: E402
from tests.support import crashing_runners  # noqa: E402
from tests.support.cli import run_cli_here  # noqa: E402

WAYS = {"segmentation fault on run": (crashing_runners.segfault_on_run, "SIGSEGV"),
        "abort() while loading": (crashing_runners.abort_on_load, "SIGABRT"),
        "SIGKILL on run (the OOM killer's)": (crashing_runners.killed_on_run, "SIGKILL")}
CNN = ["cnn.pt", "--input", "x:float32[batch,1,8,8]", "--dim", "batch=1:4:8"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", type=Path, default=RESULTS / "crash_builds.md")
    args = parser.parse_args()
    from examples.train import train_digits

    model, data = train_digits()
    real = backends.named("inductor")
    lines = ["| way of dying | builds | the crashed candidate failed, naming the signal | builds that shipped another "
             "| outputs whole | alone: exit 3, nothing written | tracebacks |", "|" + " --- |" * 7]
    with tempfile.TemporaryDirectory(prefix="crash-builds-") as tmp:
        work = Path(tmp)
        torch.jit.save(torch.jit.trace(model, torch.from_numpy(data["val"][0][:2])), str(work / "cnn.pt"))
        for way, (opener, signal_name) in WAYS.items():
            backend_registry.BACKENDS.items["inductor"] = replace(real, open_runner=opener)
            named = shipped = whole = alone_ok = tracebacks = 0
            for k in range(args.rounds):
                out = f"auto-{k}"
                proc = run_cli_here("build", *CNN, "-o", out, "--force", cwd=work)
                tracebacks += "Traceback" in proc.stderr
                if proc.returncode == 0:
                    shipped += 1
                    rows = {c["recipe"]: c for c in json.loads((work / out / "manifest.json").read_text())["candidates"]}
                    crashed = rows.get("fp32-inductor", {})
                    named += crashed.get("status") == "failed" and signal_name in (crashed.get("reason") or "")
                    whole += not verify_files(work / out, read_manifest(work / out).files)
                alone = run_cli_here("build", *CNN, "--backend", "inductor", "-o", f"alone-{k}", cwd=work)
                tracebacks += "Traceback" in alone.stderr
                alone_ok += alone.returncode == 3 and signal_name in alone.stderr and not (work / f"alone-{k}").exists()
            lines.append(f"| {way} | {args.rounds} | {named} | {shipped} | {whole} | {alone_ok} | {tracebacks} |")
            print(lines[-1], flush=True)
        backend_registry.BACKENDS.items["inductor"] = real
    text = "\n".join(["## Candidates that crash: builds that still ship (CPU)", "",
                      "`python benchmarks/crash_builds.py`", "", *lines, "", *(f"- {line}" for line in environment())])
    publish(text, args.markdown)


if __name__ == "__main__":
    main()
