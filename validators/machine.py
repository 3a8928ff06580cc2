"""The roof of the machine a build runs on, measured: memory bandwidth and fp32 matmul peak.

The ``cpu`` target is "the machine infopt runs on", so it declares no bandwidth or peak of its own;
a build for it measures both here (about a second) so its report has a roofline. Both are what this
machine reaches, not a datasheet's figure: a copy of ``COPY_MIB`` MiB (bytes read + written over the
best of ``COPY_REPEATS`` runs) and a square fp32 matmul of ``MATMUL_N`` (2n^3 FLOPs over the best of
``MATMUL_REPEATS`` runs and ``MATMUL_SECONDS``) on torch's threads.

The figures are kept in infopt's cache folder (``machine/roof.json``) for ``ROOF_MAX_AGE_S``, keyed
by what they depend on (host, CPU model, cores, torch's threads and version), so builds in a row
measure once; the note says when they were measured.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

from infopt.core.cache import cache_dir

COPY_MIB = 256
COPY_REPEATS = 3
MATMUL_N = 1024
MATMUL_REPEATS = 5
MATMUL_SECONDS = 0.5
"""the matmul runs at least this long in all: five short runs ranged widely from one build to the next on a shared
machine, and the best over half a second is steadier (benchmarks/results/rules.md)"""
ROOF_MAX_AGE_S = 24 * 3600


def _best(fn, repeats: int, seconds: float = 0.0) -> float:
    """The fastest of at least ``repeats`` runs, going on until ``seconds`` are spent, after one untimed run."""
    fn()  # first touch: page faults and thread start-up are not the machine's speed
    best, runs, began = float("inf"), 0, time.perf_counter()
    while runs < repeats or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def memory_bandwidth_gbs() -> float:
    source = np.ones(COPY_MIB * 2**20 // 8)
    target = np.empty_like(source)
    seconds = _best(lambda: np.copyto(target, source), COPY_REPEATS)
    return 2 * source.nbytes / seconds / 1e9


def fp32_peak_tflops() -> float:
    import torch  # heavy: loaded only when a build measures its roof

    a, b = torch.randn(MATMUL_N, MATMUL_N), torch.randn(MATMUL_N, MATMUL_N)
    seconds = _best(lambda: torch.mm(a, b), MATMUL_REPEATS, MATMUL_SECONDS)
    return 2 * MATMUL_N**3 / seconds / 1e12


def measured_roof(fresh: bool = False) -> tuple[float, float, str]:
    """(bandwidth GB/s, fp32 peak TFLOP/s, how they were measured): from the cache when this machine
    measured them within ``ROOF_MAX_AGE_S``, else (or with ``fresh``) measured now and kept."""
    key = _machine_key()
    path = cache_dir("machine") / "roof.json"
    try:
        kept = json.loads(path.read_text())
        if not fresh and kept["key"] == key and 0 <= time.time() - kept["when"] <= ROOF_MAX_AGE_S:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(kept["when"]))
            return kept["bandwidth"], kept["peak"], f"{kept['how']} at {when} (kept for a day)"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    bandwidth, peak = memory_bandwidth_gbs(), fp32_peak_tflops()
    how = (f"measured on this machine: bandwidth {bandwidth:.1f} GB/s (a {COPY_MIB} MiB copy, best of {COPY_REPEATS}), "
           f"fp32 peak {peak:.3g} TFLOP/s (a {MATMUL_N}x{MATMUL_N} matmul, best over {MATMUL_SECONDS:g} s)")
    staged = path.with_name(f".roof.json.{os.getpid()}")
    try:
        staged.write_text(json.dumps({"key": key, "when": time.time(), "bandwidth": bandwidth, "peak": peak, "how": how}))
        os.replace(staged, path)
    except OSError:  # a read-only cache: measure again next time
        staged.unlink(missing_ok=True)
    return bandwidth, peak, how


def _machine_key() -> str:
    import torch

    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()}|{model or platform.processor()}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}"
