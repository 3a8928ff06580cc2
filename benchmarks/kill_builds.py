"""Do killed builds leave a whole output? Real `infopt build --force` runs replacing an existing output,
killed at a uniform random time over the build (SIGTERM and SIGKILL in turn); after each kill the output
must be the old build or the new one with every file matching its manifest, and after the next command
(`infopt doctor`, or every fifth time a full build) nothing may lie beside it.

    python benchmarks/kill_builds.py --kills 50 --seed 7

Prints one JSON line: how often the old and the new output were found, broken outputs, stale siblings
after the next command, and tracebacks on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from infopt.core.manifest import read_manifest, verify_files  # noqa: E402
from tests.support.payloads import Tiny  # noqa: E402

INFOPT = [sys.executable, "-m", "infopt.cli"]
BUILD = [*INFOPT, "build", "tiny.pt", "--input", "x:float32[batch,4]", "--backend", "onnxruntime", "--force", "-q"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="infopt-kills-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    torch.jit.save(torch.jit.trace(Tiny().eval(), torch.randn(2, 4)), str(work / "tiny.pt"))
    start = time.perf_counter()
    subprocess.run(BUILD, cwd=work, env=env, capture_output=True, check=True)
    took = time.perf_counter() - start
    rng = random.Random(args.seed)
    dist = work / "dist" / "tiny"
    counts = {"old": 0, "new": 0, "broken": 0, "stale_after_next": 0, "traceback": 0}
    for i in range(args.kills):
        before = read_manifest(dist).created
        proc = subprocess.Popen(BUILD, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0, took * 1.05))
        proc.send_signal(signal.SIGTERM if i % 2 == 0 else signal.SIGKILL)
        _, err = proc.communicate()
        counts["traceback"] += "Traceback" in err
        try:
            manifest = read_manifest(dist)
            whole = verify_files(dist, manifest.files) == []
            counts["broken" if not whole else "old" if manifest.created == before else "new"] += 1
        except Exception:  # noqa: BLE001 - no readable output at all
            counts["broken"] += 1
        nxt = BUILD if i % 5 == 4 else [*INFOPT, "doctor"]
        subprocess.run(nxt, cwd=work, env=env, capture_output=True)
        counts["stale_after_next"] += any(p.name != "tiny" for p in (work / "dist").iterdir())
    shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"kills": args.kills, "build_seconds": round(took, 1), **counts}))


if __name__ == "__main__":
    main()
