"""Question: how often does `infopt gate` fail an identical candidate on this machine, and does it
still catch the regressions it is there for?

The trained digits CNN is built twice with the same recipe (baseline and an identical candidate),
once as static INT8 calibrated on inputs scaled by 0.02 (a broken quantization: accuracy collapses)
and once wrapped in ``examples.models.WithExtraWork`` (same predictions, several times the work).
The identical candidate is then gated ``--runs`` times against the baseline with the default
thresholds (latency ratio bound <= 1.10, task drop <= 0.01, the recipe's drift limits), first on a
quiet machine and, with ``--hog``, again while a busy-looping process competes for one core; each
regressed candidate is gated ``--regressed-runs`` times in each condition. Peak memory is skipped
(it runs child processes and has no noise to speak of).

    python benchmarks/bench_gate.py [--runs 100] [--hog] [--markdown benchmarks/results/gate.md]
    python benchmarks/bench_gate.py --quick      # 10 runs, no results file
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import infopt  # noqa: E402
from benchmarks.common import RESULTS, environment, publish  # noqa: E402
from examples.models import WithExtraWork  # noqa: E402
from examples.train import train_digits  # noqa: E402


def _hog(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _builds(work: Path) -> dict[str, Path]:
    model, data = train_digits()
    x, y = data["val"]
    val = work / "val.npz"
    np.savez(val, x=x, labels=y)
    bad_calib = work / "calib_scaled.npz"
    np.savez(bad_calib, x=(x * 0.02).astype(np.float32))
    common = {"example_inputs": (torch.from_numpy(x[:2]),), "backend": "onnxruntime", "progress": False, "val": val,
              "force": True}
    return {"val": val,
            "baseline": infopt.build(model, output=work / "baseline", **common).output_dir,
            "identical": infopt.build(model, output=work / "identical", **common).output_dir,
            "broken int8": infopt.build(model, output=work / "int8", precision="int8", calibration=bad_calib,
                                        require_precision=True, **common).output_dir,
            "extra work": infopt.build(WithExtraWork(model).eval(), output=work / "extra", **common).output_dir}


def _gate_runs(builds: dict[str, Path], name: str, runs: int) -> list:
    return [infopt.gate(builds[name], builds["baseline"], val=builds["val"], memory=False) for _ in range(runs)]


def _row(condition: str, name: str, results: list) -> list[str]:
    failed = sum(not r.passed for r in results)
    estimates = [e for r in results for e in r.measurements["latency"]["estimates"]]
    by_batch = sorted({e["batch"] for e in estimates})
    ratios = " / ".join(f"b{b}: " + ", ".join(f"{v:.3f}" for v in np.percentile([e["ratio"] for e in estimates if e["batch"] == b],
                                                                                  [50, 90, 99])) for b in by_batch)
    worst_lower = " / ".join(f"b{b}: {max(e['lower'] for e in estimates if e['batch'] == b):.3f}" for b in by_batch)
    groups = sorted({c.group for r in results for c in r.checks if c.passed is False})
    return [condition, name, str(len(results)), f"{failed} ({failed / len(results):.1%})", ratios, worst_lower,
            ", ".join(groups) or "-"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--regressed-runs", type=int, default=5)
    parser.add_argument("--hog", action="store_true", help="repeat everything with a busy-looping process on one core")
    parser.add_argument("--quick", action="store_true", help="10 runs, 2 per regressed candidate, no results file")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.regressed_runs = 10, 2
    elif args.markdown is None:
        args.markdown = RESULTS / "gate.md"
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as tmp:
        builds = _builds(Path(tmp))
        for condition in ["quiet"] + (["one core hogged"] if args.hog else []):
            stop = multiprocessing.Event()
            hog = multiprocessing.Process(target=_hog, args=(stop,)) if condition != "quiet" else None
            if hog:
                hog.start()
            try:
                start = time.perf_counter()
                rows.append(_row(condition, "identical", _gate_runs(builds, "identical", args.runs)))
                seconds = (time.perf_counter() - start) / args.runs
                for name in ("broken int8", "extra work"):
                    rows.append(_row(condition, name, _gate_runs(builds, name, args.regressed_runs)))
            finally:
                if hog:
                    stop.set()
                    hog.join()
    headers = ["condition", "candidate", "gates", "failed", "median ratio p50, p90, p99 per batch",
               "largest lower bound", "groups that failed"]
    lines = ["# infopt gate: false failures and detection", "", *[f"- {e}" for e in environment()],
             f"- default thresholds: latency ratio lower bound <= 1.10 (15 ABBA trials, bounds at 95%), task drop <= 0.01;"
             f" one identical gate took {seconds:.2f} s", "",
             "| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    publish("\n".join(lines), args.markdown)


if __name__ == "__main__":
    main()
